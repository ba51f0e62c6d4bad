"""``mmoa-cli webui``: LlamaBoard with the MAPPO stage and the RAG Playground.

Unlike ``llamafactory-cli webui`` (which binds 0.0.0.0 and opens a browser), this binds
127.0.0.1 unless told otherwise, opens no browser unless asked, and never makes gradio's share
tunnel unless asked. Like LlamaBoard, it works relative to the current directory: ``data/`` is
the default dataset folder, runs go to ``saves/``, and settings to ``llamaboard_cache/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class WebUIConfig:
    host: str = "127.0.0.1"
    port: int | None = None  #: None: gradio's choice (GRADIO_SERVER_PORT, else 7860 upwards)
    share: bool = False
    inbrowser: bool = False


def build_ui() -> tuple[Any, Any]:
    """``(gradio Blocks, LlamaBoard Engine)`` with the patches applied; nothing is served yet."""
    from llamafactory.webui.interface import create_ui

    from mmoa.webui.patches import apply_patches, last_engine

    apply_patches()
    demo = create_ui()
    return demo, last_engine()


def launch(config: WebUIConfig) -> None:
    """Build the UI and serve it until interrupted."""
    import ipaddress

    from llamafactory.extras.misc import fix_proxy

    demo, _ = build_ui()
    try:
        ipv6 = ipaddress.ip_address(config.host).version == 6
    except ValueError:
        ipv6 = False
    fix_proxy(ipv6_enabled=ipv6)  # keep loopback traffic away from any HTTP(S)_PROXY
    demo.queue().launch(server_name=config.host, server_port=config.port, share=config.share,
                        inbrowser=config.inbrowser, show_error=True, prevent_thread_lock=True)
    # the port gradio really bound (GRADIO_SERVER_PORT, or the first free one from 7860)
    print(f"[mmoa] web UI: http://{f'[{config.host}]' if ipv6 else config.host}:"
          f"{demo.server_port} (LlamaBoard + MAPPO stage + RAG Playground)", flush=True)
    demo.block_thread()
