"""Settings of the example project: SQLite for Django, and a SQLite broker
beside it (set DUMBWAITER_URL for Redis or PostgreSQL)."""

import os
from pathlib import Path

DATA = Path(os.environ.get("SHOP_DATA", Path(__file__).resolve().parent.parent))

SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shopsite.urls"
INSTALLED_APPS = ["django_tasks", "dumbwaiter.contrib.django", "shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DATA / "site.db")}}
TASKS = {
    "default": {
        "BACKEND": "dumbwaiter.contrib.django.DumbwaiterBackend",
        "QUEUES": ["default", "email"],
        "OPTIONS": {"url": os.environ.get("DUMBWAITER_URL") or f"sqlite:///{DATA}/jobs.db"},
    }
}
