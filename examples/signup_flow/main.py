"""A durable sign-up flow: welcome mail, wait for activation, nudge if none came.

    python examples/signup_flow/main.py

sign-up -> welcome mail -> wait up to 3 days for `user.activated` -> a nudge
mail unless the user activated.  No worker is held while a run waits: the
wait is a checkpoint and a job due at the deadline, and the published event
wakes the run early.  Here the window is 2 seconds so the demo ends; the
same code waits 3 days in production (`dumbwaiter worker` runs the steps).

Runs on a throwaway SQLite file with an in-process worker.
"""

import asyncio
import tempfile
from datetime import timedelta

import dumbwaiter as dw
from dumbwaiter.testing import drain

app = dw.App(f"sqlite:///{tempfile.mkdtemp()}/signup.db")

#: how long a new user has to activate before the nudge (3 days in production)
ACTIVATION_WINDOW = timedelta(days=3)


class UserActivated(dw.Event, type="user.activated", version=1):
    user_id: int


def send_mail(user_id: int, template: str, key: str) -> str:
    """A mail provider call; ``key`` (the step's idempotency key) lets the
    provider drop a duplicate if the step runs again after a crash."""
    print(f"  mail {template!r} to user {user_id} (idempotency key ...{key[-12:]})")
    return f"msg-{template}-{user_id}"


@app.workflow
def signup(ctx: dw.WorkflowContext, user_id: int, email: str) -> str:
    ctx.step("create-account", lambda: {"user_id": user_id, "email": email})
    ctx.step("welcome-mail", lambda: send_mail(user_id, "welcome", ctx.step_key))
    activated = ctx.wait_for_event(
        "activation", UserActivated, match={"user_id": user_id}, timeout=ACTIVATION_WINDOW
    )
    if activated is not None:
        return "activated"
    ctx.step("nudge-mail", lambda: send_mail(user_id, "nudge", ctx.step_key))
    return "nudged"


async def main() -> None:
    global ACTIVATION_WINDOW
    ACTIVATION_WINDOW = timedelta(seconds=2)  # the demo's window
    ann = await signup.aenqueue(1, "ann@example.com")
    bob = await signup.aenqueue(2, "bob@example.com")
    await drain(app, scheduled=False)  # until both runs are parked, waiting
    print("both", await ann.astatus(), "for activation; ann activates")
    await app.apublish(UserActivated(user_id=1))
    await drain(app)  # ann wakes now; bob at the end of the window
    print("ann:", await ann.aresult(timeout=30))
    print("bob:", await bob.aresult(timeout=30))
    for step in (await bob.ainfo())["steps"]:
        print(f"  bob's {step['kind']} {step['name']!r}: {step['status']}")


if __name__ == "__main__":
    asyncio.run(main())
