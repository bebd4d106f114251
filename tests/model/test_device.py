"""Host arrays to the device in one copy (refengine/model/device.py), on the CPU: device_cases.py."""

from device_cases import *  # noqa: F403
