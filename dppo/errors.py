"""The user-facing configuration error, in a module of its own so that reading a run folder (`dppo.runfiles`,
`dppo.results`) needs neither torch nor the config's registries."""


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""
