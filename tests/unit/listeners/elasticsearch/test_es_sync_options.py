"""ElasticsearchSync's identity in checkpoints (no credentials) and its defaults."""

from __future__ import annotations

from listeners.elasticsearch import ElasticsearchSync


def test_sink_identity_names_the_nodes_and_the_index_without_credentials() -> None:
    listener = ElasticsearchSync(
        database="shop", collection="Orders", es="https://user:s3cret@es.example:9200"
    )
    assert listener.sink_identity() == "elasticsearch https://es.example:9200/shop.orders"
    assert listener.deployment()["sink"] == listener.sink_identity()
    pool = ElasticsearchSync(
        database="shop", collection="orders", es=["http://a:9200", "http://k:p@b:9201"]
    )
    assert pool.sink_identity() == "elasticsearch http://a:9200,http://b:9201/shop.orders"
    assert "s3cret" not in listener.sink_identity() and "k:p" not in pool.sink_identity()


def test_a_mirror_resyncs_when_its_history_is_lost_by_default() -> None:
    listener = ElasticsearchSync(database="shop", collection="orders", es="http://es:9200")
    assert listener.on_history_lost == "resync"
    other = ElasticsearchSync(
        database="shop", collection="orders", es="http://es:9200", on_history_lost="fail"
    )
    assert str(other.on_history_lost) == "fail"


def test_a_sink_name_replaces_the_addresses_for_replicas_that_reach_the_cluster_differently() -> (
    None
):
    a = ElasticsearchSync(database="d", collection="c", es="http://proxy-a:9200", sink_name="prod")
    b = ElasticsearchSync(database="d", collection="c", es="http://proxy-b:9200", sink_name="prod")
    assert a.sink_identity() == b.sink_identity() == "elasticsearch prod/d.c"
