"""The package version, at the bottom of the house.

Every layer may import it without importing the package face (`jupyter_gpuaas/__init__.py`),
whose lazy hooks reach up into `server/` and `notebook` code.
"""

__version__ = "0.1.0"
