"""npudoctor: pre-flight doctor and hot-fix kit for sglang deployments on Ascend NPUs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npudoctor")
except PackageNotFoundError:  # running from a checkout without installing
    __version__ = "0+unknown"
