"""The serve release: up, rollback, down (deploy.py), history and status, and the live watch."""
