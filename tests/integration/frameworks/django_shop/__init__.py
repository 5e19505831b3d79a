"""A minimal Django app for tests/integration/frameworks/test_django.py: its
``tasks`` module is what ``manage.py dumbwaiter_worker`` discovers."""
