"""`enrich-crawl mapping check` and `enrich-crawl mapping test`, run as a user runs them."""

from __future__ import annotations

import json

from enrich_crawl_tests.conftest import FIXTURES, REPO, product_env, run_cli

DEMO_WEB = REPO / "enrich_crawl" / "demo" / "web"


def test_check_lists_valid_mappings(tmp_path):
    proc = run_cli(["mapping", "check", "mappings"], product_env(), REPO)
    assert proc.returncode == 0, proc.stderr
    assert "ok  python_docs_module" in proc.stdout
    assert "valid mapping(s) in mappings" in proc.stdout
    as_json = run_cli(["mapping", "check", "--json", "mappings"], product_env(), REPO)
    report = json.loads(as_json.stdout)
    assert report["errors"] == []
    assert {m["name"] for m in report["valid"]} >= {"python_docs_module", "python_docs_modindex"}


def test_check_reports_every_problem_with_file_and_json_path(tmp_path):
    (tmp_path / "good.json").write_text(
        json.dumps(
            {
                "name": "good",
                "url_patterns": ["^https://x\\.example/"],
                "fields": [{"name": "a", "processors": [{"type": "first"}]}],
            }
        )
    )
    (tmp_path / "bad.json").write_text(
        json.dumps(
            {
                "name": "bad",
                "url_patterns": ["^https://x\\.example/"],
                "fields": [
                    {
                        "name": "a",
                        "processors": [{"type": "regex", "parameters": {"pattern": "(a*)*"}}],
                    },
                    {
                        "name": "b",
                        "processors": [{"type": "xpath", "parameters": {"expression": "//a["}}],
                    },
                ],
            }
        )
    )
    (tmp_path / "broken.json").write_text('{"name": ')
    proc = run_cli(["mapping", "check", str(tmp_path)], product_env(), REPO)
    assert proc.returncode == 1
    assert "ok  good" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert (
        f"error: {tmp_path / 'bad.json'}: $.fields[0].processors[0].parameters.pattern: "
        in (errors[0])
    )
    assert any(
        "$.fields[1].processors[0].parameters.expression: invalid XPath" in e for e in errors
    )
    assert any(f"{tmp_path / 'broken.json'}: $: not valid JSON" in e for e in errors)
    assert "2 invalid mapping file(s) (3 problem(s)), 1 valid" in proc.stderr
    missing = run_cli(["mapping", "check", str(tmp_path / "nope")], product_env(), REPO)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_test_on_a_saved_page_prints_the_spec_json():
    page = DEMO_WEB / "directory.example" / "orgs.html"
    proc = run_cli(
        [
            "mapping",
            "test",
            "mappings/demo_directory.json",
            "--file",
            str(page),
            "--base-url",
            "http://directory.example/orgs.html#org-caf%C3%A9-m%C3%BCller",
        ],
        product_env(),
        REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "mappings": ["demo_directory"],
        "fields": {
            "city": "Zürich",
            "country": "Switzerland",
            "founded": 1952,
            "phone": "+41 44 555 12 34",
        },
        "links": [],
    }


def test_test_options_fragment_id_dataset_force_and_no_match(tmp_path):
    case = FIXTURES / "mappings" / "python_docs_modindex" / "json"
    dataset = tmp_path / "d.yaml"
    (tmp_path / "d.csv").write_text("module,url,synopsis,deprecated\njson,http://x/,,\n")
    dataset.write_text(
        "name: d\nsource: d.csv\nid: module\nurls: [url]\n"
        "fields:\n  synopsis: {}\n  deprecated: {type: string}\n"
    )
    base = ["mapping", "test", "mappings", "--file", str(case / "input.html")]
    typed = run_cli(
        [
            *base,
            "--base-url",
            "https://docs.python.org/3.11/py-modindex.html",
            "--id",
            "json",
            "--dataset",
            str(dataset),
        ],
        product_env(),
        REPO,
    )
    assert typed.returncode == 0, typed.stderr
    assert json.loads(typed.stdout)["fields"] == {
        "synopsis": "Encode and decode the JSON format.",
        "deprecated": "false",  # typed as the dataset says: a string
    }
    nomatch = run_cli(
        [*base, "--base-url", "https://elsewhere.example/x.html"], product_env(), REPO
    )
    assert nomatch.returncode == 0
    assert json.loads(nomatch.stdout) == {"mappings": [], "fields": {}, "links": []}
    assert "no mapping's url_patterns match https://elsewhere.example/x.html" in nomatch.stderr
    forced = run_cli(
        [
            "mapping",
            "test",
            "mappings/python_docs_modindex.json",
            "--file",
            str(case / "input.html"),
            "--base-url",
            "https://elsewhere.example/x.html",
            "--force",
            "--id",
            "json",
        ],
        product_env(),
        REPO,
    )
    assert json.loads(forced.stdout)["fields"]["synopsis"] == "Encode and decode the JSON format."


def test_test_usage_errors_are_clear(tmp_path):
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    no_base = run_cli(["mapping", "test", "mappings", "--file", str(page)], product_env(), REPO)
    assert no_base.returncode == 2 and "--file needs --base-url" in no_base.stderr
    bad_mapping = tmp_path / "m.json"
    bad_mapping.write_text('{"name": "m", "url_patterns": []}')
    invalid = run_cli(
        ["mapping", "test", str(bad_mapping), "--file", str(page), "--base-url", "https://x/"],
        product_env(),
        REPO,
    )
    assert invalid.returncode == 2
    assert f"{bad_mapping}: $.url_patterns: must not be an empty list" in invalid.stderr
    missing = run_cli(
        [
            "mapping",
            "test",
            "mappings",
            "--file",
            str(tmp_path / "none.html"),
            "--base-url",
            "https://x/",
        ],
        product_env(),
        REPO,
    )
    assert missing.returncode == 2 and "none.html: cannot read" in missing.stderr
    relative = run_cli(["mapping", "test", "mappings", "--url", "x.example/a"], product_env(), REPO)
    assert relative.returncode == 2 and "not an absolute URL" in relative.stderr


def test_test_fetches_through_the_proxy_and_follows_redirects(tmp_path):
    from enrich_crawl.virtualweb import running_web

    web_root = tmp_path / "web"
    site = web_root / "api.registry.example"
    (site / "v1" / "orgs").mkdir(parents=True)
    (site / "v1" / "orgs" / "ORG-001.json").write_bytes(
        (DEMO_WEB / "api.registry.example" / "v1" / "orgs" / "ORG-001.json").read_bytes()
    )
    (site / "_web.json").write_text(json.dumps({"redirects": {"^/old/(.*)$": "/v1/orgs/\\1"}}))
    with running_web(web_root) as web:
        proc = run_cli(
            [
                "mapping",
                "test",
                "mappings",
                "--url",
                "http://api.registry.example/old/ORG-001.json",
            ],
            product_env(**web.proxy_env()),
            REPO,
            timeout=120,
        )
        gone = run_cli(
            [
                "mapping",
                "test",
                "mappings",
                "--url",
                "http://api.registry.example/v1/orgs/NOPE.json",
            ],
            product_env(**web.proxy_env()),
            REPO,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "mappings": ["demo_registry_api"],  # matched on the final URL, after the redirect
        "fields": {"open_source": False, "last_release": "2025-03-03"},
        "links": [],
    }
    assert "redirected to http://api.registry.example/v1/orgs/ORG-001.json" in proc.stderr
    assert gone.returncode == 0 and "answered HTTP 404" in gone.stderr


def test_test_reads_an_https_page_as_the_crawl_does(tmp_path):
    """The virtual web answers https:// through CONNECT with certificates of its own CA, which
    nothing trusts, as many real sites' chains are not: the crawl reads such pages (Scrapy does not
    verify certificates) and `mapping test --url` must too; and like the crawl it sends https://
    through `http_proxy` when that is the only proxy set."""
    from enrich_crawl.virtualweb import running_web

    site = tmp_path / "web" / "api.registry.example" / "v1" / "orgs"
    site.mkdir(parents=True)
    (site / "ORG-001.json").write_bytes(
        (DEMO_WEB / "api.registry.example" / "v1" / "orgs" / "ORG-001.json").read_bytes()
    )
    url = "https://api.registry.example/v1/orgs/ORG-001.json"
    with running_web(tmp_path / "web") as web:
        # http_proxy alone (the crawl sends https:// through it too), then https_proxy as well
        runs = [
            run_cli(["mapping", "test", "mappings", "--url", url], env, REPO, timeout=120)
            for env in (product_env(http_proxy=web.proxy_url), product_env(**web.proxy_env()))
        ]
        tunnelled = [e for e in web.read_log() if e.get("tls") and e.get("method") == "GET"]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {
            "mappings": ["demo_registry_api"],
            "fields": {"open_source": False, "last_release": "2025-03-03"},
            "links": [],
        }
        assert proc.stderr == ""
    # through the proxy's TLS tunnel, not around it
    assert [e["path"] for e in tunnelled] == ["/v1/orgs/ORG-001.json"] * 2, tunnelled
