"""A rank whose collective broke on a lost connection, in a run of several nodes, says which nodes to look at."""

from __future__ import annotations

from sc_lightning.trainer.rank_deaths import lost_peer

GLOO_LOST = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.7]:41234")


def test_a_lost_connection_names_the_other_nodes() -> None:
    assert lost_peer(GLOO_LOST, node_rank=1, num_nodes=3) == (
        "node 1 lost its connection to another trainer rank: if a rank of another node (node 0, 2) ended, that "
        "node's output says why"
    )


def test_one_node_or_another_error_adds_nothing() -> None:
    assert lost_peer(GLOO_LOST, node_rank=0, num_nodes=1) == ""  # the launcher's children are named by their exit
    assert lost_peer(RuntimeError("CUDA out of memory"), node_rank=0, num_nodes=2) == ""
