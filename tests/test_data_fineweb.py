"""download_fineweb against a stand-in for the Hugging Face Hub on 127.0.0.1 (no internet)."""

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from speedgpt.data.fineweb import download_fineweb, fineweb_filenames
from speedgpt.data.shards import ShardError, load_shard, write_shard

REPO = "kjj0/fineweb10B-gpt2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def patient_hub_client(monkeypatch):
    """huggingface_hub gives a request 10 s; on a busy CI box the local stand-in server's thread can
    be starved that long, failing a test that is not about timeouts. The tests that are about broken
    transfers break them on purpose (cut_once), never by timing. Online too: under xdist a worker may have
    run the hf_offline tests first, and huggingface_hub reads HF_HUB_OFFLINE once, at its import."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 600)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 600)


class FakeHub:
    """Answers the Hub's resolve URLs /datasets/{repo}/resolve/{revision}/{filename} with the
    headers huggingface_hub relies on (X-Repo-Commit, ETag, Content-Length) and Range support."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.log: list[tuple[str, str, str | None]] = []  # (method, filename, Range header)
        self.cut_once: set[str] = set()  # GETs of these files break off after cut_at bytes, once
        self.cut_at = 12_000_000  # past huggingface_hub's 10 MB write chunk, so part of it is on disk
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _target(self):
                m = re.fullmatch(rf"/datasets/{re.escape(REPO)}/resolve/([^/]+)/(.+)", self.path)
                name = m and m.group(2)
                hub.log.append((self.command, name, self.headers.get("Range")))
                if name not in hub.files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return name

            def _head(self, data: bytes, status=200, extra=()):
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                for k, v in extra:
                    self.send_header(k, v)

            def do_HEAD(self):
                name = self._target()
                if name:
                    data = hub.files[name]
                    self._head(data, extra=[("Content-Length", str(len(data)))])
                    self.end_headers()

            def do_GET(self):
                name = self._target()
                if not name:
                    return
                data = hub.files[name]
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
                    body = data[start:]
                    self._head(data, 206, [("Content-Length", str(len(body))),
                                           ("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")])
                else:
                    body = data
                    self._head(data, extra=[("Content-Length", str(len(body)))])
                self.end_headers()
                if name in hub.cut_once and not rng:
                    hub.cut_once.discard(name)
                    self.wfile.write(body[: hub.cut_at])  # then the connection drops
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def gets(self, name=None):
        return [entry for entry in self.log if entry[0] == "GET" and (name is None or entry[1] == name)]


def shard_bytes(tmp_path, name, n, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50256, size=n)
    tokens[0] = 50256
    path = tmp_path / "src" / name
    write_shard(path, tokens)
    return path.read_bytes()


@pytest.fixture
def hub_files(tmp_path):
    files = {name: shard_bytes(tmp_path, name, 20_000 + 1000 * i, i) for i, name in enumerate(fineweb_filenames(3))}
    # 17 MB: big enough that an interrupted transfer has written some of it before the break.
    files["fineweb_train_000001.bin"] = shard_bytes(tmp_path, "big.bin", 8_500_000, 9)
    return files


def test_names_follow_the_speedrun():
    assert fineweb_filenames(2) == ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    with pytest.raises(ValueError, match="has 103 train shards"):
        download_fineweb("unused", 104)


def test_download_resumes_interrupted_file_and_verifies(tmp_path, hub_files):
    out = tmp_path / "fineweb"
    with FakeHub(hub_files) as hub:
        hub.cut_once.add("fineweb_train_000001.bin")
        paths = download_fineweb(out, 2, endpoint=hub.url, progress=False)
        assert [p.name for p in paths] == fineweb_filenames(2)
        for p in paths:
            assert p.read_bytes() == hub_files[p.name]
        # The broken transfer was resumed with a Range request from what had arrived, not restarted.
        ranges = [r for _, _, r in hub.gets("fineweb_train_000001.bin")]
        assert len(ranges) == 2 and ranges[0] is None
        resumed_at = int(re.fullmatch(r"bytes=(\d+)-", ranges[1]).group(1))
        assert 0 < resumed_at <= hub.cut_at
        assert load_shard(out / "fineweb_train_000001.bin").numel() == 8_500_000
        n_requests = len(hub.log)
        # A second call (more shards) keeps complete files and fetches only the new one.
        download_fineweb(out, 3, endpoint=hub.url, progress=False)
        assert [name for _, name, _ in hub.log[n_requests:] if name] == ["fineweb_train_000003.bin"] * 2  # HEAD + GET


def test_corrupt_download_is_rejected(tmp_path, hub_files):
    bad = bytearray(hub_files["fineweb_train_000002.bin"])
    bad[0:4] = b"\0\0\0\0"  # wrong magic
    hub_files["fineweb_train_000002.bin"] = bytes(bad)
    short = hub_files["fineweb_train_000003.bin"]
    out = tmp_path / "fineweb"
    with FakeHub(hub_files) as hub:
        with pytest.raises(ShardError, match=r"fineweb_train_000002\.bin downloaded from kjj0/fineweb10B-gpt2@main .*magic 0"):
            download_fineweb(out, 3, endpoint=hub.url, progress=False)
        assert not (out / "fineweb_train_000002.bin").exists()  # not left behind to be trusted later
        assert (out / "fineweb_train_000001.bin").exists()  # earlier good files are kept
        # A file whose size disagrees with its header (truncated at the source) is rejected too.
        hub.files["fineweb_train_000002.bin"] = hub_files["fineweb_val_000000.bin"]
        hub.files["fineweb_train_000003.bin"] = short[:-100]
        with pytest.raises(ShardError, match=r"fineweb_train_000003\.bin .*truncated"):
            download_fineweb(out, 3, endpoint=hub.url, progress=False)


def test_broken_local_leftover_is_fetched_again(tmp_path, hub_files):
    out = tmp_path / "fineweb"
    out.mkdir()
    (out / "fineweb_val_000000.bin").write_bytes(hub_files["fineweb_val_000000.bin"][:5000])  # a killed copy
    with FakeHub(hub_files) as hub:
        download_fineweb(out, 0, endpoint=hub.url, progress=False)
        assert len(hub.gets("fineweb_val_000000.bin")) == 1
    assert (out / "fineweb_val_000000.bin").read_bytes() == hub_files["fineweb_val_000000.bin"]


def test_an_endpoint_that_does_not_answer_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """Was ten lines of "Retrying in 2s [Retry 2/5]" and the hub library's text, naming no endpoint."""
    import logging
    import socket

    from huggingface_hub.utils import _http

    from speedgpt.cli import main

    monkeypatch.setattr(_http.time, "sleep", lambda seconds: None)  # the library's retries, minus their waits
    with socket.socket() as s:  # a port that nobody listens on once it is closed
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        assert main(["data", "fineweb", "--out", str(tmp_path / "fw"), "--shards", "1"]) == 2
    finally:
        logging.getLogger("huggingface_hub").removeHandler(handler)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"speedgpt data fineweb: error: cannot reach the Hugging Face Hub at {url} (")
    assert "set HF_ENDPOINT=URL (or pass --endpoint URL)" in err
    assert not [r for r in logged if r.levelno < logging.ERROR]  # no retry chatter
    # Nothing left behind: fw/.cache/huggingface/... made `ls fw` look empty and later commands say "not empty".
    assert not (tmp_path / "fw").exists()
    mine = tmp_path / "mine"  # a folder the user had: kept, with its files, and without the hub's .cache
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["data", "fineweb", "--out", str(mine), "--shards", "1"]) == 2
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    capsys.readouterr()


def test_a_partial_download_is_kept_for_the_next_call_to_resume(tmp_path, hub_files):
    """The cleanup of a failed call removes only the hub's bookkeeping, never a partial file worth resuming."""
    out = tmp_path / "fw"
    partial = out / ".cache" / "huggingface" / "download" / "fineweb_val_000000.bin.incomplete"
    with FakeHub({}) as hub:  # every file missing: the download fails
        with pytest.raises(Exception):
            download_fineweb(out, 0, endpoint=hub.url, progress=False)
    assert not (out / ".cache").exists()
    partial.parent.mkdir(parents=True)  # as a connection broken mid-file leaves it (the cache is older now)
    partial.write_bytes(b"x" * 100)
    with FakeHub({}) as hub:
        with pytest.raises(Exception):
            download_fineweb(out, 0, endpoint=hub.url, progress=False)
    assert partial.read_bytes() == b"x" * 100


@pytest.mark.parametrize("argv, env, says", [
    (["--endpoint", "notaurl"], None, "--endpoint 'notaurl' is not a URL; give one starting with http:// or https://"),
    (["--endpoint", "ftp://mirror"], None, "--endpoint 'ftp://mirror' is not a URL"),
    (["--endpoint", "http://"], None, "--endpoint 'http://' is not a URL"),
    ([], "mirror.example", "HF_ENDPOINT 'mirror.example' is not a URL"),
])
def test_an_endpoint_that_is_no_url_is_refused_before_anything_is_made(tmp_path, monkeypatch, capsys, argv, env,
                                                                       says):
    """Was httpx's UnsupportedProtocol error, exit 1."""
    from speedgpt.cli import main

    if env:
        monkeypatch.setenv("HF_ENDPOINT", env)
    with pytest.raises(SystemExit) as e:
        main(["data", "fineweb", "--out", str(tmp_path / "fw"), "--shards", "1", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "fw").exists()
    with pytest.raises(ValueError, match="is not a URL"):
        download_fineweb(tmp_path / "fw", 1, endpoint="notaurl")
