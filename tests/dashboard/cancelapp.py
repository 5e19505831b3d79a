"""The dashboard tests' app as a module attribute, for a worker process
(``dumbwaiter worker --app tests.dashboard.cancelapp:app``)."""

from tests.dashboard.dashapp import create_app

app = create_app()
