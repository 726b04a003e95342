"""An example third-party kvgate policy package."""
