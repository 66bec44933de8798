"""Turning config plus a request into a frozen Plan; estimators used by that decision."""
