"""A stand-in for http1.Responder that records what the gateway wrote (in-process gateway tests)."""

import orjson


class Recorder:
    """What http1.Responder offers the gateway, recorded."""

    def __init__(self):
        self.status = 0
        self.headers: list = []
        self.body = b""
        self.started = self.ended = self.aborted = False
        self.client_gone = False
        self.stopping = False
        self.request_id = self.path = self.rejected_path = None
        self.counted = False

    def send(self, status, headers, body):
        self.status, self.headers, self.body, self.started, self.ended = status, headers, body, True, True

    def start(self, status, headers, content_length=None):
        self.status, self.headers, self.started = status, headers, True

    def write(self, data):
        self.body += data

    def end(self):
        self.ended = True

    def abort(self):
        self.aborted = self.ended = True

    async def drain(self):
        pass

    def json(self):
        return orjson.loads(self.body)

    def header(self, name: bytes):
        return dict(self.headers).get(name)
