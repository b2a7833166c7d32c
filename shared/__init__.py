"""Code every statefleet service uses: settings, the Faust app factory, topics,
codecs, dead letters, and the HTTP plumbing (health, metrics, forwarding)."""
