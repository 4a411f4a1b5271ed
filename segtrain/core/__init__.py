"""What every layer may use: segtrain's error types (``errors``), the named-choice registries (``registry``) and
the old module paths that moved (``moved_modules``). Imports no other segtrain package."""
