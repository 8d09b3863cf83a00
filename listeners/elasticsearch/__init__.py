"""Keep an Elasticsearch (or OpenSearch) index equal to a MongoDB collection.

One package, one sink. Dependencies run one way: :mod:`.sync` composes the others, which know
nothing of the listener (the copy gets functions, the bulk writer a callback for dead letters).

* :mod:`.sync` - :class:`ElasticsearchSync`, the listener users configure;
* :mod:`.bulk` - the bulk writer (per-item results, retries, dead letters);
* :mod:`.transport` - HTTP to the cluster (plain ``application/json``, works with ES 7-9 and
  OpenSearch);
* :mod:`.documents` - BSON document -> JSON source (the non-finite rule), index name;
* :mod:`.ids` - BSON ``_id`` <-> index ``_id``, injective and reversible;
* :mod:`.fragments` - change events over 16 MB (split fragments, events without their document);
* :mod:`.versioning` - external versions derived from the oplog position;
* :mod:`.index` - the alias, its physical index, the atomic swap, ``gc_deletes``;
* :mod:`.copy` - the resumable initial copy;
* :mod:`.verify` - compare a collection with its index (the drill and the demo use it);
* :mod:`.deadletters` - bulk rejections -> the listener's dead-letter store.
"""

from __future__ import annotations

from listeners.elasticsearch.sync import ElasticsearchSync
from listeners.elasticsearch.verify import Diff, compare, es_documents

__all__ = ["Diff", "ElasticsearchSync", "compare", "es_documents"]
