"""Ephemeral real services (MongoDB-wire, PostgreSQL, Redis) for tests, the demo and benchmarks.

Each launcher is a context manager: the service runs on a free loopback port, keeps its files in a
temporary directory, runs in its own process session (a Ctrl-C in the terminal does not reach it) and
is always stopped and its directory removed on exit, exceptions included. Handles can ``stop()`` and
``start()`` the service again on the same port with the same data, to simulate an outage::

    with ephemeral_mongo(data_dir=tmp_path / "mongo") as mongo:
        client = pymongo.MongoClient(mongo.uri)
        mongo.stop()   # writes now fail ...
        mongo.start()  # ... and succeed again, same port, same data

Modules: common (errors, ports, the child process), mongo, redis, postgres.
"""

from enrich_crawl.store.embedded import pid_alive
from enrich_crawl.testing.services.common import MissingServiceBinary, ServiceError, free_port
from enrich_crawl.testing.services.mongo import MongoHandle, ephemeral_mongo
from enrich_crawl.testing.services.postgres import PgHandle, ephemeral_postgres
from enrich_crawl.testing.services.redis import RedisHandle, ephemeral_redis

__all__ = [
    "MissingServiceBinary",
    "MongoHandle",
    "PgHandle",
    "RedisHandle",
    "ServiceError",
    "ephemeral_mongo",
    "ephemeral_postgres",
    "ephemeral_redis",
    "free_port",
    "pid_alive",
]
