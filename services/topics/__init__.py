"""The chart's topic Job: creates the fleet's topics before the services start.

A job, not a service (no tables, no HTTP API, exits when the topics exist). It is the one
folder of ``services/`` that imports others: the topics a release needs are the ones the
validator's domain and the tallies' projection name, read through those services' own
loaders, so that the Job and the services cannot disagree on a name. No service imports it.
"""
