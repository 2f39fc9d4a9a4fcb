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


class _SlowHandler:
    """A message handler that takes `seconds` over each message; `stuck_at`: never returns from
    that message (a run's storage gone away)."""

    def __init__(self, seconds: float = 0.0, stuck_at: int | None = None) -> None:
        self.seconds = seconds
        self.stuck_at = stuck_at
        self.release = threading.Event()
        self.started = threading.Event()
        self.handled: list[dict] = []

    def handle_message(self, message: dict) -> None:
        self.started.set()
        if len(self.handled) == self.stuck_at:
            self.release.wait(30)
        time.sleep(self.seconds)
        self.handled.append(message)

    def report_pipes_framework_exception(self, *args) -> None:
        pass


def test_a_stuck_message_handler_does_not_keep_the_step_from_ending(tmp_path, caplog):
    path = tmp_path / "messages"
    handler = _SlowHandler(stuck_at=0)
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
    assert "handled no message for" in caplog.text and str(path) in caplog.text


def test_a_slow_backlog_is_read_to_its_end_however_long_it_takes(tmp_path, caplog):
    """The grace counts from the last message handled, not from the end of the crawl: a backlog
    that keeps moving (a slow run storage) is handed over whole, the final statistics with it."""
    path = tmp_path / "messages"
    handler = _SlowHandler(seconds=0.1)
    reader = PatientFileMessageReader(str(path), grace=0.5)
    messages = [{"method": "log", "params": {"n": n}} for n in range(12)]  # 1.2 s > the grace
    with (
        caplog.at_level("WARNING", logger="enrich_crawl.defs.pipes"),
        reader.read_messages(handler) as params,
    ):
        with open(params["path"], "a", encoding="utf-8") as out:
            out.writelines(json.dumps(m) + "\n" for m in messages)
        assert handler.started.wait(5)
    assert handler.handled == messages
    assert "handled no message" not in caplog.text
