"""A real S3 endpoint for benches: moto's server on loopback, credentials in this process's environment."""

from __future__ import annotations

import os


def start_s3_endpoint(*buckets: str):
    """Start a moto S3 server, point ``AWS_*`` at it and create ``buckets``; returns the server
    (``stop()`` it when done).

    Call it before Ray starts, so that Ray's workers inherit the endpoint and credentials.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret",
                      AWS_DEFAULT_REGION="us-east-1")
    client = boto3.client("s3", endpoint_url=endpoint)
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
    return server
