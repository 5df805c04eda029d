"""The generation layer: what a model declares it can do (`capabilities`), the one rule that
lays a request's prompt and answer out in a row (`layout`), between the checkpoints below
and every command and the server above, which lay their rows out through it."""
