"""MMOA-RAG: a multi-agent RAG pipeline trained with MAPPO, as a fork layer over ``llamafactory``.

Importing the package switches off every hub and telemetry call before ``transformers``,
``datasets`` or ``gradio`` are imported: all models and datasets of this project are local
directories, and a machine without internet must never wait on a time-out.
"""

from mmoa.env import configure_offline

__version__ = "0.1.0"

configure_offline()

__all__ = ["__version__", "configure_offline"]
