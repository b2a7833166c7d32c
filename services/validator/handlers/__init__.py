"""The validator's sub-topologies, one module each: every one declares its tables and
registers its batch handlers on the engine; :mod:`services.validator.app` composes them."""
