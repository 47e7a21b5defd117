"""Run on one host: a Fleet API ``PullMessages`` signed with a SuperNode's key.

``python tests/hosts_probe.py KEY CA ADDRESS NODE_ID`` (started with ``ip netns
exec`` on that SuperNode's host by tests/test_hosts.py) signs the request with
the OpenSSH private key KEY, as ``flower-supernode`` does, claims NODE_ID, and
prints one line: ``ok <messages>`` or ``refused <HTTP status>``.
"""

import sys
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.proto.fleet_pb2 import PullMessagesRequest  # pylint: disable=E0611
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor


def main(key: str, ca: str, address: str, node_id: str) -> None:
    private = load_ssh_private_key(Path(key).read_bytes(), None)
    with FleetHttpClient.from_server_address(
            address, False, ca,
            interceptors=[NodeAuthHttpInterceptor(private, private.public_key())]
    ) as client:
        try:
            reply = client.PullMessages(
                PullMessagesRequest(node=Node(node_id=int(node_id))))
        except httpx.HTTPStatusError as err:
            print(f"refused {err.response.status_code}")
            return
    print(f"ok {len(reply.messages_list)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
