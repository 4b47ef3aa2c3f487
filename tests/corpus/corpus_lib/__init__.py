"""A small "library" the corpus scripts import: its branches decide, not the script's."""
