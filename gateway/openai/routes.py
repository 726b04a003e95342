"""The routes the gateway serves besides chat and completions, and how each is placed.

- ``POST /v1/chat/completions``, ``/v1/completions``: cache-aware (the configured policy on the prompt);
- ``POST /v1/responses``: cache-aware; sticky to the worker that stored ``previous_response_id``;
- ``GET|DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``, ``GET /v1/responses/{id}/
  input_items``: the worker that stored the response;
- ``POST /v1/embeddings``: load-balanced (least loaded): a prefix cache buys nothing there;
- ``PASS_THROUGH`` below: load-balanced, JSON bodies, answers relayed as they come (streams too).

Everything else is 404. The pass-through routes are the ones the engines add to OpenAI's
(``docs/engines.md``): vLLM's and SGLang's tokenizer, scoring and pooling routes and Anthropic's Messages
API, which vLLM, SGLang and LMDeploy serve. A body's ``model`` picks the workers; a route whose body may omit
it (``/tokenize``) goes to any worker when the fleet serves one model.
"""

from __future__ import annotations

from typing import Final

from gateway.openai.schema import Framing, Route

EMBEDDINGS_ROUTE: Final = Route(b"/v1/embeddings", "embeddings", None, Framing.EOF)

#: path → label of the declared pass-through routes (POST, JSON body)
PASS_THROUGH: Final = {
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
    "/tokenize": "tokenize",
    "/detokenize": "tokenize",
    "/v1/tokenize": "tokenize",
    "/v1/detokenize": "tokenize",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/v1/score": "score",
    "/score": "score",
    "/pooling": "pooling",
    "/classify": "pooling",
}

#: the routes placed by load, by path
BALANCED_ROUTES: Final = {
    "/v1/embeddings": EMBEDDINGS_ROUTE,
    **{path: Route(path.encode(), label, None, Framing.EOF) for path, label in PASS_THROUGH.items()},
}
#: routes whose body must name a model (the others may leave it out: any worker of a one-model fleet)
MODEL_REQUIRED: Final = frozenset({"/v1/embeddings", "/v1/messages", "/v1/messages/count_tokens"})

RESPONSES_PREFIX: Final = "/v1/responses/"

#: every route that reaches a worker with a POST body: auth, rate limits and the concurrency cap apply to them
WORKER_PATHS: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", *BALANCED_ROUTES}
)  # fmt: skip
