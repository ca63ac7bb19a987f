"""npudoctor: pre-flight doctor and hot-fix kit for sglang deployments on Ascend NPUs."""


def __getattr__(name: str):
    # The version is looked up on first use: importlib.metadata costs ~20 ms, and the
    # `npudoctor run` bootstrap imports this package in every Python process it starts.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("npudoctor")
        except PackageNotFoundError:  # running from a checkout without installing
            return "0+unknown"
    raise AttributeError(f"module 'npudoctor' has no attribute {name!r}")
