"""Talkstream on Ray Serve (`talkstream serve --ray`): the deployment and its autoscaling, every replica's health and
metrics in one view, the CLI flags. Only `app` imports Ray."""
