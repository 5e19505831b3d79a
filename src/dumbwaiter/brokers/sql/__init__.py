"""What the SQL engines (SQLite, PostgreSQL) share: rows and filters."""
