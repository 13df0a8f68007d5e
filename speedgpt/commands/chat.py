"""`speedgpt chat RUN`: talk to a fine-tuned model in the terminal, in a local web page (--serve), or
get one answer for a script (--prompt)."""

from __future__ import annotations

import argparse
import errno
import sys

from ..argv import Parser
from .sampling_options import add_sampling_options, check_sampling_options

CHAT_EPILOG = """\
examples:
  speedgpt chat runs/base-sft-x                        # terminal: /clear starts over, Ctrl-D or /quit ends
  speedgpt chat runs/base-sft-x --prompt "What is 12 + 7?" --temperature 0
  speedgpt chat runs/base-sft-x --serve --port 8000    # then open http://127.0.0.1:8000
Ctrl-C stops an answer; at the prompt it ends the chat. The model must come from `speedgpt sft`.
"""


def cmd_chat(argv: list[str]) -> int:
    p = Parser(prog="speedgpt chat", epilog=CHAT_EPILOG, description="Chat with a model that "
               "`speedgpt sft` fine-tuned (KV cache kept across turns; answers streamed).",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN", help="an SFT run directory")
    p.add_argument("--prompt", metavar="TEXT", help="print one answer to TEXT and exit")
    p.add_argument("--serve", action="store_true", help="serve a chat web page instead of the terminal chat")
    p.add_argument("--host", help="address to bind with --serve (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, help="port with --serve (default 8000; 0: any free port)")
    add_sampling_options(p, temperature=0.6, max_tokens=256, what="answer")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    args = p.parse_args(argv)
    check_sampling_options(p, args)
    if args.port is not None and not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: must be 0..65535")
    if args.prompt is not None and args.serve:
        p.error("--prompt answers once in the terminal; --serve serves the web page: pick one")
    unserved = [flag for flag, value in (("--host", args.host), ("--port", args.port)) if value is not None]
    if unserved and not args.serve:  # the terminal chat listens on nothing: the value would be silently ignored
        verb = "say" if len(unserved) > 1 else "says"
        p.error(f"{' and '.join(unserved)} {verb} where --serve listens: add --serve, or drop "
                f"{'them' if len(unserved) > 1 else 'it'}")

    from ..chat.session import ChatSession, ContextFull, cut_reason
    from ..chat.template import ConversationError, chat_template
    from ..config import ConfigError
    from ..infer.load import LoadError, load_model
    from ..tokenizer.folder import run_tokenizer

    try:
        model, cfg = load_model(args.run_dir, device=args.device, checkpoint=args.checkpoint)
        template = chat_template(run_tokenizer(args.run_dir, cfg), cfg.model)
    except (LoadError, ConfigError, ConversationError, ValueError) as e:
        print(f"speedgpt chat: {e}", file=sys.stderr)
        return 2

    def session() -> ChatSession:
        return ChatSession(model, template, temperature=args.temperature, top_k=args.top_k or None,
                           max_new_tokens=args.max_tokens, seed=args.seed)

    if args.serve:
        return _serve(session, args.host or "127.0.0.1", 8000 if args.port is None else args.port)
    if args.prompt is not None:
        chat = session()
        try:
            for piece in chat.reply(args.prompt):
                print(piece, end="", flush=True)
        except ContextFull:
            print(f"speedgpt chat: the prompt fills the model's context ({chat.context} tokens); shorten it",
                  file=sys.stderr)
            return 2
        except ConversationError as e:
            print(f"speedgpt chat: {e}", file=sys.stderr)
            return 2
        print()
        if chat.cut:  # the answer is printed as far as it went; say that it did not end
            print(f"speedgpt chat: the answer was {cut_reason(chat)}", file=sys.stderr)
        return 0
    return _terminal(session())


def _terminal(chat) -> int:
    from ..chat.session import cut_reason

    print("chat: type a message; /clear starts a new conversation, /quit or Ctrl-D ends. Ctrl-C stops an answer.")
    while True:
        try:
            text = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        text = text.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/clear":
            chat.clear()
            print("(new conversation)")
            continue
        print("assistant> ", end="", flush=True)
        try:
            for piece in chat.reply(text):
                print(piece, end="", flush=True)
            if chat.cut:
                print(f" [{cut_reason(chat)}{'; /clear starts a new one' * (chat.cut == 'context')}]", end="")
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        except ValueError as e:  # the context is full
            print(f"({e})", end="")
        print()


def _serve(session_factory, host: str, port: int) -> int:
    from ..chat.serve import make_server

    try:
        server = make_server(session_factory, host, port)
    except OSError as e:  # a port in use, or a --host this machine does not have (or cannot resolve)
        fix = "pick another --port" if e.errno == errno.EADDRINUSE else "give --host an address of this machine"
        print(f"speedgpt chat: cannot listen on {host}:{port} ({e.strerror or e}); {fix}", file=sys.stderr)
        return 2
    h, p = server.server_address[:2]
    print(f"chat page: http://{h}:{p}/  (Ctrl-C stops the server)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nstopped")
    finally:
        server.server_close()
    return 0
