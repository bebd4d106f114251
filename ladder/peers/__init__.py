"""Launchers for other engines, so that `ladder run --serve-cmd` can start them like any server."""
