"""Engine adapters. Adding a framework: one file here, and one import line below."""

from adapters.base import ADAPTERS, Adapter, register  # noqa: F401

from adapters import hf  # noqa: F401,E402
from adapters import vllm  # noqa: F401,E402
from adapters import trtllm  # noqa: F401,E402
from adapters import lmdeploy  # noqa: F401,E402
from adapters import llamacpp  # noqa: F401,E402
