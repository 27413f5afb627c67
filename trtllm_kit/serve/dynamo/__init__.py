"""``serve --dynamo``: NVIDIA Dynamo's frontend and the kit's CPU workers, run as one service."""
