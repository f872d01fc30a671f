"""boto3 as the S3 tests (and the stale writer) use it: path-style SigV4 to an
endpoint, with ``Fencing-Token`` added before signing, so the token is one of the
signed headers (``SignedHeaders``) and the upstream verifies it unchanged."""

import boto3
from botocore.config import Config

REGION = "garage"


def s3_client(endpoint: str, access_key: str, secret_key: str, token=lambda: None, ca=None, **config):
    """A client of ``endpoint`` (trusting the CA file ``ca`` for https). ``token()`` is
    called for every request; when it returns a number, that is the request's
    ``Fencing-Token``."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        verify=str(ca) if ca else None,
        region_name=REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            # A 409 from the proxy is final; a retry would only hide what it answered.
            retries={"max_attempts": 1, "mode": "standard"},
            **config,
        ),
    )

    def add_token(request, **_):
        value = token()
        if value is not None:
            request.headers["Fencing-Token"] = str(value)

    # before-sign: the header exists when SigV4 lists and signs the headers.
    client.meta.events.register("before-sign.s3.*", add_token)
    return client
