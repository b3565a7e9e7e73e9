"""Stand-ins for other packages' ops: they import nothing of opbridge (tests bridge them)."""
