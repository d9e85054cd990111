"""pydemo_runner: the py-demo model as an out-of-process Resin runner.

model.py holds the forward (start: the Llama-family reference in numpy), reference.py the
naive forward that tests it, and `python -m pydemo_runner --weights DIR` serves it over
Resin's runner protocol.
"""

from .model import Config, Model

__all__ = ["Config", "Model"]
