"""PostgreSQL store tests: store level, two lockd processes on one database, PostgreSQL restarts."""
