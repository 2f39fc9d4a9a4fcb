"""The crawl step's Pipes message reader: every message the worker writes arrives whole and in order,
and an idle crawl does not keep the step polling its message file."""

from __future__ import annotations

import json
import threading
import time

from enrich_crawl.defs.pipes import POLL_MAX, PatientFileMessageReader


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def _read_all(path, closed) -> tuple[list[dict], threading.Thread]:
    got: list[dict] = []

    def run() -> None:
        got.extend(json.loads(line) for line in PatientFileMessageReader.lines(str(path), closed))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return got, thread


def test_messages_arrive_whole_and_in_order_even_when_written_in_pieces(tmp_path):
    path = tmp_path / "messages"
    path.write_text("")
    closed = CountingEvent()
    got, thread = _read_all(path, closed)
    messages = [{"method": "log", "params": {"n": n, "text": "x" * n}} for n in range(50)]
    with open(path, "a", encoding="utf-8") as out:
        for message in messages:
            line = json.dumps(message) + "\n"
            half = len(line) // 2
            out.write(line[:half])  # the worker was interrupted mid-line: the reader must wait
            out.flush()
            time.sleep(0.002)
            out.write(line[half:])
            out.flush()
        out.write(json.dumps({"method": "closed", "params": {}}) + "\n")  # right before closing
    closed.set()
    thread.join(10)
    assert not thread.is_alive()
    assert got == [*messages, {"method": "closed", "params": {}}]


def test_an_idle_message_file_is_read_less_and_less_often(tmp_path):
    path = tmp_path / "messages"
    path.write_text("")
    closed = CountingEvent()
    got, thread = _read_all(path, closed)
    time.sleep(3.0)
    idle_waits = closed.waits
    # Dagster's tail_file looks every 10 ms (300 times in 3 s); backing off to POLL_MAX it is
    # about a dozen times
    assert idle_waits <= 8 + 3.0 / POLL_MAX, idle_waits
    with open(path, "a", encoding="utf-8") as out:
        out.write('{"method": "log", "params": {}}\n')
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [{"method": "log", "params": {}}]  # still read, within POLL_MAX
    started = time.monotonic()
    closed.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 1.0  # closing wakes it at once


class _StuckHandler:
    """A message handler that never returns from a message (a run's storage gone away)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def handle_message(self, message: dict) -> None:
        self.started.set()
        self.release.wait(30)

    def report_pipes_framework_exception(self, *args) -> None:
        pass


def test_a_stuck_message_handler_does_not_keep_the_step_from_ending(tmp_path, caplog):
    path = tmp_path / "messages"
    handler = _StuckHandler()
    reader = PatientFileMessageReader(str(path), grace=0.5)
    started = time.monotonic()
    with (
        caplog.at_level("WARNING", logger="enrich_crawl.defs.pipes"),
        reader.read_messages(handler) as params,
    ):
        with open(params["path"], "a", encoding="utf-8") as out:
            out.write('{"method": "log", "params": {}}\n')
        assert handler.started.wait(5)
    took = time.monotonic() - started
    handler.release.set()
    assert took < 5, took
    assert "not all handled" in caplog.text and str(path) in caplog.text
