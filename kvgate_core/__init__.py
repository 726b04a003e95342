"""The shared floor of kvgate. Importing it first decides, once per process, whether the compiled request
path may load (``kvgate_core.native``)."""

from kvgate_core.native import guard

guard()
