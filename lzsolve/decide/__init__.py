"""Deciding from the records: the tree per op signature (solve), its check on off-grid shapes while
tuning (validate), the held-out evaluation of an artifact (evaluate) and its comparison with a
previous one (compare)."""
