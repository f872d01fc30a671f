"""An aws-cli (v1) plugin that adds ``Fencing-Token`` to every S3 request, before it is
signed, so that the token is one of the SigV4 signed headers.

aws-cli has no option that adds a header to its requests. It loads plugins named in the
``[plugins]`` section of its config file, each a Python module it imports and whose
``awscli_initialize`` it calls with its event emitter; a handler registered there runs
for every request of every client the command makes (the whole-object PUT, each part of
a multipart upload, its completion, DELETE):

    [plugins]
    fencing_token = awscli_fencing_token

with the directory of this file on ``PYTHONPATH``. The token is read from the
environment at each request: ``PALISADE_FENCING_TOKEN`` (and, when the proxy checks
token proofs, ``PALISADE_FENCING_TOKEN_PROOF`` as ``Fencing-Token-Proof``); when the
variable is unset or empty, no header is added and the proxy refuses the write (428).

``tests/backends/test_s3_clients.py`` runs aws-cli with this file as written.
"""

import os

HEADERS = {
    "Fencing-Token": "PALISADE_FENCING_TOKEN",
    "Fencing-Token-Proof": "PALISADE_FENCING_TOKEN_PROOF",
}


def awscli_initialize(cli):
    # before-sign: the header exists when SigV4 lists and signs the headers (a header
    # added in before-send would be sent unsigned).
    cli.register("before-sign.s3.*", add_fencing_headers)


def add_fencing_headers(request, **_):
    for header, variable in HEADERS.items():
        value = os.environ.get(variable)
        if value:
            # The headers are a multi-map: delete first, so the header is never doubled.
            del request.headers[header]
            request.headers[header] = value
