"""What the ``python -m segtrain.<tool>`` entry points share: the Hydra main that turns a user's mistake into
one line and an exit status (``hydra_main``) and the sweep callbacks (``sweep``). Part of the entry layer:
nothing below it imports it."""
