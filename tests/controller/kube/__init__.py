"""Tests of ``cachescale.controller.kube``: the API client, informers, stores, indexes, peering."""
