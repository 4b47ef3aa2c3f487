"""The diagnosis corpus (see README.md): scripts, their expected answers, and the check."""
