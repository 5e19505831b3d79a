import dumbwaiter as dw

app = dw.App()  # embedded SQLite in ./dumbwaiter.db (or $DUMBWAITER_URL)


@app.task(retry=dw.Retry(attempts=4), keep_result=True)
def send_welcome(user_id: int) -> str:
    return f"welcome mail sent to user {user_id}"


if __name__ == "__main__":
    job = send_welcome.enqueue(42)
    print(job.id, job.status())  # e.g. 01a2...  ready
    print(job.result(timeout=30))  # waits for a worker: welcome mail sent to user 42
