"""What joins the store to the models: the round, pair making from a policy, the child processes the app starts and
watches (both ends of their protocol), the stages the commands run on the store's data, and the demo loop.

`annotate/` (people and data) and `rlhf/` (training) never import this package; it imports both.
"""
