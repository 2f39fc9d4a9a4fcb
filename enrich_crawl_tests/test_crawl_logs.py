"""What a crawl writes to its log: its own messages, warnings and errors, not Scrapy's start-up and
shutdown boilerplate (versions, "Overridden settings", the enabled components, telnet, the stats
dump), neither on the terminal (the crawl process's stderr: `enrich-crawl run -v`, `dagster job
execute`, the step's captured log in the UI) nor in the Dagster run's log."""

from __future__ import annotations

import json

from enrich_crawl.testing.synthweb import crawl_through_pipes, write_dataset
from enrich_crawl.virtualweb import running_web

MAPPING = {
    "name": "tls_site",
    "url_patterns": [{"type": "regex", "pattern": r"^https://l-tls\.test/"}],
    "fields": [
        {
            "name": "value",
            "processors": [{"type": "xpath", "parameters": {"expression": "//span[@id='v']"}}],
        }
    ],
}

BOILERPLATE = (
    "Scrapy 2.",  # "Scrapy 2.19.0 started (bot: enrich_crawl)"
    "Versions:",
    "Overridden settings",
    "Enabled addons",
    "Enabled extensions",
    "Enabled downloader middlewares",
    "Enabled spider middlewares",
    "Enabled item pipelines",
    "Telnet",
    "Dumping Scrapy stats",
)


def test_a_crawl_logs_its_own_messages_and_not_scrapys_boilerplate(tmp_path, capfd):
    site = tmp_path / "web" / "l-tls.test"
    site.mkdir(parents=True)
    (site / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    (site / "a.html").write_text("<html><body><span id='v'>found</span></body></html>")
    rows = [{"id": "a", "url": "https://l-tls.test/a.html"}]
    dataset, mappings = write_dataset(
        tmp_path, rows, fields={"value": {}}, mappings={"tls": MAPPING}, crawl={"depth": 0}
    )
    # one of our own errors, which must stay
    (mappings / "broken.json").write_text('{"name": "broken"}', encoding="utf-8")
    with running_web(tmp_path / "web") as server:
        # "INFO": what `enrich-crawl run -v` and `dagster dev` use
        key, out_dir, messages = crawl_through_pipes(
            dataset, mappings, tmp_path / "work", proxy=server.proxy_url, log_level="INFO"
        )
    terminal = capfd.readouterr().err

    # the page was read over https (the crawl does not verify certificates, see
    # test_mapping_cli.py: `mapping test --url` reads it the same way)
    stats = json.loads((out_dir / "stats.json").read_text(encoding="utf-8"))
    assert stats["outcomes"] == {"resolved": 1}, stats
    for line in BOILERPLATE:
        assert line not in terminal, (line, terminal[:3000])
        assert not [m for m in messages if line in m], (line, messages)
    # our own messages and errors stay, on the terminal and in the run's log
    assert "mapping skipped" in terminal, terminal[:3000]
    assert any("mapping skipped" in m for m in messages), messages
    assert any(m.startswith(f"[{key}] records 1/1 done") for m in messages), messages
    # Scrapy's own lines at INFO that are not boilerplate still pass (the filter is by logger)
    assert "Spider opened" in terminal, terminal[:3000]
