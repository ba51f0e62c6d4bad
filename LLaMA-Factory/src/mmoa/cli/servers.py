"""``mmoa-cli webui``, ``serve`` and ``index``: the web UI, and the retrieval server and index
builder with exactly their scripts' options."""

from __future__ import annotations

import argparse

from mmoa.cli.common import Commands, add_script_command


def _cmd_webui(args: argparse.Namespace) -> int:
    from mmoa.webui.launch import WebUIConfig, launch

    launch(WebUIConfig(host=args.host, port=args.port, share=args.share,
                       inbrowser=args.inbrowser))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from mmoa.retrieval.server import main as serve_main

    return serve_main(args.script_argv)


def _cmd_index(args: argparse.Namespace) -> int:
    from mmoa.retrieval.builder import main as build_main

    return build_main(args.script_argv)


def add_webui_command(commands: Commands) -> None:
    webui = commands.add_parser(
        "webui",
        help="LLaMA-Factory's web UI (LlamaBoard) with the MAPPO stage and a RAG playground",
        description=(
            "Start LlamaBoard with a 'MAPPO (multi-agent RAG)' stage in the Train tab and a "
            "'RAG Playground' tab. Like llamafactory-cli webui it works relative to the current "
            "directory (data/ for datasets, saves/ for runs); unlike it, it binds 127.0.0.1 and "
            "opens no browser unless asked."
        ),
        epilog=(
            "examples:\n"
            "  mmoa-cli webui                                  # http://127.0.0.1:7860\n"
            "  mmoa-cli webui --port 7861\n"
            "  mmoa-cli webui --host 0.0.0.0 --port 7860      # reachable from the network"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    webui.add_argument("--host", default="127.0.0.1",
                       help="bind address (default 127.0.0.1; 0.0.0.0 exposes the UI)")
    webui.add_argument("--port", type=int, default=None,
                       help="port (default: $GRADIO_SERVER_PORT, else 7860 or the next free)")
    webui.add_argument("--share", action="store_true",
                       help="also open a public gradio share link (needs internet)")
    webui.add_argument("--inbrowser", action="store_true", help="open a local browser tab")
    webui.set_defaults(handler=_cmd_webui)


def add_serve_command(commands: Commands) -> None:
    from mmoa.retrieval.server import ENV_PREFIX, build_arg_parser

    serve = add_script_command(
        commands, "serve", build_arg_parser(), _cmd_serve,
        help_text="start the retrieval server (same as run_server.sh / flask_server.py)",
        description=(
            "Serve an index folder over HTTP: gunicorn, one worker process holding the index, "
            "many request threads sharing one micro-batcher. Binds 127.0.0.1 by default. "
            f"Every option can also be set as {ENV_PREFIX}<OPTION> in the environment."
        ),
        examples=(
            "examples:\n"
            "  mmoa-cli serve --index data/demo/index                 # http://127.0.0.1:8000\n"
            "  mmoa-cli serve --index data/wiki_e5 --port 8001 --threads 64 --faiss-gpu on\n"
            f"  {ENV_PREFIX}TOKEN=secret mmoa-cli serve --index data/demo/index --host 0.0.0.0"
        ),
    )
    serve.set_defaults(script_argv=None)


def add_index_command(commands: Commands) -> None:
    from mmoa.retrieval.builder import build_arg_parser

    index = add_script_command(
        commands, "index", build_arg_parser(), _cmd_index,
        help_text="build a retrieval index folder (same as data_builders/build_index.py)",
        description=(
            "Encode a passage corpus and write an index folder (index.faiss + memory-mapped "
            "corpus/ + meta.json) for the retrieval server."
        ),
        examples=(
            "examples:\n"
            "  mmoa-cli index --corpus data/demo/corpus.jsonl --output data/demo/index\n"
            "  mmoa-cli index --corpus data/psgs_w100.tsv --output data/wiki_contriever \\\n"
            "      --preset contriever --encoder models/facebook/contriever \\\n"
            "      --factory IVF65536,PQ64 --device cuda --fp16"
        ),
    )
    index.set_defaults(script_argv=None)
