"""The public face: :class:`SpeculativeGenerator` — point it at a GGUF target and an MoA drafter
and get the target's own output, faster.

Example::

    from moa_cpp import SpeculativeGenerator
    gen = SpeculativeGenerator.from_paths("target.gguf", "drafter.gguf", draft="chain:3")
    # any GGUF, no drafter: prompt-lookup (n-gram) drafts, cost-aware (never slower than plain)
    gen = SpeculativeGenerator.from_paths("target.gguf", spec_type="ngram")
    result = gen.generate("Write a haiku about the sea.", chat=True, max_tokens=64)
    print(result.text, result.stats.tau, result.stats.tokens_per_s)
    for piece in gen.stream("Once upon a time", max_tokens=32):
        print(piece, end="", flush=True)

Its parts: :mod:`moa_cpp.speculative.draft_setting` (draft shapes), :mod:`moa_cpp.streaming` (pieces as they
are verified, results), :mod:`moa_cpp.llama_compat` (llama-cpp-python's argument and response
shapes for ``create_completion`` / ``create_chat_completion``).
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from moa_cpp.speculative.draft_setting import parse_draft
from moa_cpp.drafter.drafter import DrafterModel
from moa_cpp.llama_compat import (CHAT_NOOP, NOOP, chat_chunks, chat_messages, chat_response, llama_sampling,
                           refuse_unsupported, stop_list, tool_chunks, tool_response)
from moa_cpp.speculative.loop import SpeculativeLoop
from moa_cpp.speculative.proposers import (NgramSettings, make_proposer, moa_state, parse_spec_type,
                                           resolve_spec_type)
from moa_cpp.speculative.types import DraftConfig, SamplingParams, SpecStats
from moa_cpp.streaming import GenerationResult, PendingLogprobs, Piece, held_back
from moa_cpp.structured import grammar_text, request_grammar
from moa_cpp.target.target import Target
from moa_cpp.token_spans import TokenSpans

__all__ = ["GenerationRequest", "GenerationResult", "Piece", "SpeculativeGenerator", "parse_draft"]

Prompt = Union[str, Sequence[int]]


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, typed once (vLLM's ``SamplingParams`` + the draft setting): what
    :meth:`SpeculativeGenerator.stream_request` runs. The keyword API (:meth:`~SpeculativeGenerator.generate`,
    :meth:`~SpeculativeGenerator.stream_steps`) and the server build it;
    :meth:`SpeculativeGenerator.sampling_params` checks the sampling values.

    ``prompt``: text, token ids, or chat messages (``chat=True``: the GGUF's chat template,
    with ``tools`` where the template renders them). ``draft``: this call's draft shape (None:
    the generator's). ``logprobs``: each token's logprob and this many alternatives (None: off).
    ``cache_prompt``: reuse the prefix the caches hold (llama.cpp's name). ``token_spans``: fill
    :attr:`Piece.spans` (who chose each token)."""

    prompt: Any
    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    draft: Optional[DraftConfig] = None
    stop: tuple = ()
    chat: bool = False
    logprobs: Optional[int] = None
    cache_prompt: bool = True
    token_spans: bool = False
    tools: Optional[tuple] = None


class SpeculativeGenerator:
    """Lossless speculative generation over a llama.cpp target.

    Greedy output (temperature 0) is token-identical to plain greedy decoding of the target;
    with temperature > 0 every token is distributed exactly as the target's own sampling.
    Build with :meth:`from_paths` or :meth:`from_llama`. Who drafts (``spec_type``, see
    :func:`~moa_cpp.speculative.proposers.parse_spec_type`): ``"moa"`` (the default with a
    ``drafter``), ``"ngram"`` (prompt lookup: any target, no drafter), ``"draft"``, a hybrid such
    as ``"moa,ngram"``, or a ready ``proposer``; none of them: plain decoding through the same
    loop (the comparison baseline).
    """

    def __init__(self, target: Target, drafter: Optional[DrafterModel] = None, *,
                 draft: Union[str, DraftConfig, None] = None, n_ctx: Optional[int] = None, proposer: Any = None,
                 spec_type: Union[str, Sequence[str], None] = None, ngram: NgramSettings = NgramSettings(),
                 draft_min: int = 0) -> None:
        self.target = target
        self.drafter = drafter
        kinds = resolve_spec_type(spec_type, drafter=drafter is not None, draft_model=False) \
            if proposer is None else parse_spec_type(spec_type)
        has_proposer = bool(kinds) or proposer is not None
        self.draft = parse_draft(draft) if has_proposer else DraftConfig("none")
        if proposer is None:
            proposer = make_proposer(kinds, target, self.draft, drafter=drafter, n_ctx=n_ctx or target.n_ctx,
                                     ngram=ngram)
        self.proposer = proposer
        self.spec_type = ",".join(kinds) if proposer is not None and kinds else getattr(proposer, "name", "none")
        self.state = moa_state(proposer)          # the MoA drafter's state, if one drafts
        self.loop = SpeculativeLoop(target, self.proposer, self.draft)
        self.loop.draft_min = int(draft_min)
        self.last_stats: Optional[SpecStats] = None
        self._last_prompt: list = []     # token ids of the latest prompt (encoded once per call)

    @classmethod
    def from_paths(cls, target_path: Union[str, Path], drafter_path: Union[str, Path, None] = None, *,
                   n_ctx: int = 4096, n_threads: Optional[int] = None, n_gpu_layers: int = 0, device: str = "auto",
                   draft: Union[str, DraftConfig, None] = None, tli: Optional[int] = None,
                   draft_model: Union[str, Path, None] = None, rpc: Optional[Sequence[str]] = None,
                   spec_type: Union[str, Sequence[str], None] = None, ngram: NgramSettings = NgramSettings(),
                   draft_min: int = 0, target_options: Optional[dict] = None) -> "SpeculativeGenerator":
        """Open a GGUF target and (optionally) an MoA drafter GGUF, or a small LLM GGUF with the
        target's tokenizer for classic draft-model speculation (``draft_model``). ``spec_type``
        (default: ``moa`` with a drafter, ``draft`` with a draft model, else plain decoding): who
        drafts, e.g. ``"ngram"`` or ``"moa,ngram"``. ``rpc``: llama.cpp rpc-servers
        (``["host:port", ...]``) that hold the offloaded target layers. ``draft_min``: a proposal
        of fewer drafts is not verified (llama.cpp's ``--draft-min``). ``target_options``: more
        :meth:`Target.from_path` keywords (``n_batch``, ``use_mlock``, ``chat_template``, ...)."""
        if drafter_path is not None and draft_model is not None:
            raise ValueError("pass an MoA drafter or a draft model, not both")
        kinds = resolve_spec_type(spec_type, drafter=drafter_path is not None, draft_model=draft_model is not None)
        target = Target.from_path(target_path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, rpc=rpc,
                                  **(target_options or {}))
        try:
            drafter = (DrafterModel(drafter_path, target_path, device=device, n_threads=n_threads, tli=tli)
                       if drafter_path is not None else None)
            cfg = parse_draft(draft) if kinds else DraftConfig("none")
            proposer = make_proposer(kinds, target, cfg, drafter=drafter, draft_model=draft_model, n_ctx=n_ctx,
                                     n_threads=n_threads, n_gpu_layers=n_gpu_layers, ngram=ngram)
        except BaseException:
            target.close()
            raise
        return cls(target, drafter, draft=draft, proposer=proposer, spec_type=kinds, draft_min=draft_min)

    @classmethod
    def from_llama(cls, llm: Any, drafter_path: Union[str, Path, None] = None, *,
                   draft: Union[str, DraftConfig, None] = None, device: str = "auto",
                   n_threads: Optional[int] = None) -> "SpeculativeGenerator":
        """Reuse an existing ``llama_cpp.Llama`` (its model weights; a new context is created)."""
        target = Target.from_llama(llm, n_threads=n_threads)
        drafter = (DrafterModel(drafter_path, llm.model_path, device=device, n_threads=n_threads)
                   if drafter_path is not None else None)
        return cls(target, drafter, draft=draft)

    # ------------------------------------------------------------------ prompts

    def encode(self, prompt: Prompt, chat: bool = False, tools: Optional[list] = None) -> list:
        """Prompt text (optionally wrapped in the target's chat template) or ids -> ids. With
        ``chat``, ``prompt`` may also be a list of ``{"role", "content"}`` messages (``tools``:
        OpenAI tools the template renders)."""
        if chat and isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
            text = self.target.apply_chat_template(list(prompt), tools=tools)
            return self.target.tokenize(text, add_bos=False, special=True).tolist()
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if chat:
            text = self.target.apply_chat_template([{"role": "user", "content": prompt}])
            return self.target.tokenize(text, add_bos=False, special=True).tolist()
        return self.target.tokenize(prompt, add_bos=True, special=False).tolist()

    # ------------------------------------------------------------------ generation

    def stream_steps(self, prompt: Prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, seed: Optional[int] = None, stop: Sequence[str] = (), chat: bool = False,
                     draft: Union[str, DraftConfig, None] = None, ignore_eos: bool = False,
                     logprobs: Optional[int] = None, min_p: float = 0.0, repeat_penalty: float = 1.0,
                     frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_last_n: int = 64,
                     logit_bias: Optional[dict] = None, grammar: Any = None,
                     cache_prompt: bool = True, token_spans: bool = False) -> Iterator[Piece]:
        """Yield a :class:`Piece` per cycle (new token ids, new text, and with ``logprobs`` = N
        the :class:`TokenLogprob` (N alternatives) of the tokens whose text this piece completes:
        logprobs travel with their text, so none is given for text a stop string cut off);
        the last piece carries the generation's :class:`SpecStats` (``piece.stats``; also kept in
        :attr:`last_stats`). ``grammar``: GBNF text or a ``llama_cpp.LlamaGrammar``
        (llama.cpp's grammar on every verification row: :mod:`moa_cpp.speculative.grammar`).
        ``cache_prompt`` (llama.cpp's name): decode only what follows the prefix this
        generator's caches hold from its previous generation (a chat's earlier turns).
        ``token_spans``: fill :attr:`Piece.spans` (each piece split by token, with who chose each
        token: :mod:`moa_cpp.token_spans`; the server's chat page asks for it)."""
        req = GenerationRequest(prompt, max_tokens, self.sampling_params(
            temperature, top_k, top_p, seed, ignore_eos, min_p, repeat_penalty, frequency_penalty, presence_penalty,
            repeat_last_n, logit_bias, grammar), parse_draft(draft) if draft is not None else None, tuple(stop), chat,
            logprobs, cache_prompt, token_spans)
        yield from self.stream_request(req)

    def stream_request(self, req: GenerationRequest) -> Iterator[Piece]:
        """:meth:`stream_steps` of a typed request (the server's path: its request is checked and
        typed once, then run here)."""
        ids = self.encode(req.prompt, req.chat, list(req.tools) if req.tools else None)
        self._last_prompt = ids
        sp, max_tokens, logprobs = req.sampling, req.max_tokens, req.logprobs
        cfg = req.draft if self.proposer is not None else None
        stop = [s for s in req.stop if s]
        shown = 0          # characters of the text handed out so far
        stats = None
        render = self.target.text_stream()
        lps = PendingLogprobs(self.target)
        spans = TokenSpans(self.target) if req.token_spans else None

        def split(text: str) -> list:
            return spans.split(text) if spans is not None else []
        for ev in self.loop.run(ids, max_tokens, sp, cfg, logprobs, reuse=req.cache_prompt):
            stats = ev.stats
            if not ev.tokens:
                continue
            full = render.extend(ev.tokens)
            lps.add(ev.logprobs)
            if spans is not None:
                spans.add(ev.tokens, ev.origins)
            # search only where a stop string could newly start
            start = max(0, shown - max((len(s) for s in stop), default=0))
            hit = min((i for i in (full.find(s, start) for s in stop) if i >= 0), default=-1)
            if hit >= 0:
                stats.finish_reason = "stop"
                self.last_stats = stats
                yield Piece(ev.tokens, full[shown:hit], lps.starting_before(full[:hit]), split(full[shown:hit]),
                            stats=stats)
                return
            # hold back what may still become a stop string or a multi-byte character
            end = len(full) - held_back(full, stop)
            piece, shown = full[shown:max(shown, end)], max(shown, end)
            yield Piece(ev.tokens, piece, lps.ending_within(full[:shown]) if lps.pending else [], split(piece))
        self.last_stats = stats
        if stats is not None:      # the last piece: what text is left, and the statistics
            tail = render.extend([])[shown:]
            yield Piece([], tail, lps.rest(), split(tail), stats=stats)

    def sampling_params(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                        seed: Optional[int] = None, ignore_eos: bool = False, min_p: float = 0.0,
                        repeat_penalty: float = 1.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                        repeat_last_n: int = 64, logit_bias: Optional[dict] = None,
                        grammar: Any = None) -> SamplingParams:
        """The sampling settings (llama.cpp's names), checked against this target (a bad value is
        a ValueError, never a NaN distribution) and typed once for a :class:`GenerationRequest`."""
        if not (temperature >= 0 and top_k >= 0 and 0 < top_p <= 1 and 0 <= min_p <= 1 and repeat_penalty > 0
                and repeat_last_n >= -1 and all(math.isfinite(x) for x in (frequency_penalty, presence_penalty,
                                                                              repeat_penalty))):
            raise ValueError("sampling settings out of range: temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                             "0 <= min_p <= 1, repeat_penalty > 0, repeat_last_n >= -1, finite penalties")
        bias = []
        for tok, b in (logit_bias or {}).items():
            t = int(tok)
            if not 0 <= t < self.target.n_vocab or math.isnan(float(b)) or float(b) == math.inf:
                raise ValueError(f"logit_bias: token {tok} is not in the vocabulary or its bias {b} is not a number")
            bias.append((t, float(b)))
        return SamplingParams(temperature, top_k, top_p, seed, ignore_eos=bool(ignore_eos), min_p=min_p,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, penalty_last_n=repeat_last_n,
                              logit_bias=tuple(sorted(bias)), grammar=grammar_text(grammar))

    def stream_tokens(self, prompt: Prompt, **kw: Any) -> Iterator[tuple[list, str]]:
        """Yield ``(new token ids, new text)`` per cycle (see :meth:`stream_steps`)."""
        for p in self.stream_steps(prompt, **kw):
            yield p.tokens, p.text

    def stream(self, prompt: Prompt, **kw: Any) -> Iterator[str]:
        """Yield text pieces as they are verified (see :meth:`generate` for the arguments)."""
        for _, piece in self.stream_tokens(prompt, **kw):
            if piece:
                yield piece

    def generate(self, prompt: Prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: Optional[int] = None, stop: Sequence[str] = (), chat: bool = False,
                 draft: Union[str, DraftConfig, None] = None, ignore_eos: bool = False,
                 **sampling: Any) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens.

        Args:
            prompt: text or token ids.
            temperature: 0 = greedy (lossless: identical to plain greedy decoding).
            top_k, top_p, seed: sampling settings (temperature > 0).
            stop: stop strings (the text is cut before the first one).
            chat: wrap the prompt in the target GGUF's chat template.
            draft: per-call override, e.g. "chain:5" or "tree:6,8,62".
            ignore_eos: never stop at an end-of-generation token (llama.cpp's ``--ignore-eos``):
                run to ``max_tokens`` or the end of the context.
            sampling: ``min_p``, ``repeat_penalty``, ``frequency_penalty``, ``presence_penalty``,
                ``repeat_last_n`` (64; the generated tokens the penalties look at), ``logit_bias``
                ({token id: bias}), ``logprobs`` (see :meth:`stream_steps`), ``grammar`` (GBNF
                text or a ``llama_cpp.LlamaGrammar``). Order as llama.cpp: bias, penalties,
                grammar, top-k, top-p, min-p, temperature. Penalties and bias change
                greedy decoding too (as in llama.cpp); speculation keeps it token-identical.
        """
        tokens: list = []
        pieces: list = []
        st = None
        for p in self.stream_steps(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, seed=seed, stop=stop, chat=chat, draft=draft,
                                   ignore_eos=ignore_eos, **sampling):
            tokens += p.tokens
            pieces.append(p.text)
            st = p.stats or st
        return GenerationResult("".join(pieces), tokens, st, st.finish_reason if st else "length",
                                list(self._last_prompt))

    def create_completion(self, prompt: Prompt, suffix: Optional[str] = None, max_tokens: Optional[int] = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: Optional[int] = None, echo: bool = False,
                          stop: Union[str, List[str], None] = [], frequency_penalty: float = 0.0,  # noqa: B006
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                          stopping_criteria: Any = None, logits_processor: Any = None, grammar: Any = None,
                          logit_bias: Optional[Dict[int, float]] = None, ignore_eos: bool = False) -> Any:
        """``llama_cpp.Llama.create_completion`` (0.3.36): the same arguments, defaults and
        response shape; the response also carries ``"moa"``: the speculative statistics.

        Implemented: ``prompt`` (text or ids), ``max_tokens`` (None or <= 0: up to the end of the
        context), ``temperature`` (0: greedy, lossless; < 0: sampling from the distribution the
        penalties leave, as llama-cpp-python), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``,
        ``frequency_penalty``, ``presence_penalty`` (over the last 64 generated tokens),
        ``logit_bias``, ``stop``, ``seed``, ``stream``, ``model`` (the response's model name),
        ``logprobs`` (N alternatives per token, from the verification rows: the model's, before
        the grammar, as llama-cpp-python's), ``grammar`` (a ``LlamaGrammar``: llama.cpp's grammar
        on every verification row, after the penalties), and moa_cpp's
        ``ignore_eos``; in llama-cpp-python's order (bias, penalties, top-k, top-p, min-p,
        temperature). Every other argument is accepted only at a value that changes nothing (its
        default), else ``ValueError``: nothing is silently dropped. Greedy text equals
        llama-cpp-python's, penalties included.
        """
        refuse_unsupported("create_completion", locals(), NOOP)
        return self._completion(prompt, False, max_tokens, stop_list(stop), stream, model, seed=seed,
                                ignore_eos=ignore_eos, logprobs=logprobs, grammar=grammar,
                                **llama_sampling(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                                  presence_penalty, logit_bias))

    def create_chat_completion(self, messages: List[dict], functions: Any = None, function_call: Any = None,
                               tools: Any = None, tool_choice: Any = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0,
                               stream: bool = False, stop: Union[str, List[str], None] = [],  # noqa: B006
                               seed: Optional[int] = None, response_format: Any = None,
                               max_tokens: Optional[int] = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: Optional[str] = None, logits_processor: Any = None, grammar: Any = None,
                               logit_bias: Optional[Dict[str, float]] = None, logprobs: Optional[bool] = None,
                               top_logprobs: Optional[int] = None, ignore_eos: bool = False) -> Any:
        """``llama_cpp.Llama.create_chat_completion`` (0.3.36) with the target's chat template:
        the same arguments, defaults and response / chunk shapes, plus ``"moa"`` (the statistics)
        in a whole response. ``messages``: ``{"role", "content"}`` dicts, the content a string or
        a list of ``{"type": "text", "text": ...}`` parts. Implemented and refused arguments as in
        :meth:`create_completion`; ``tools`` / ``tool_choice`` (and the legacy ``functions`` /
        ``function_call``) as :mod:`moa_cpp.tools` says: a named function is a forced call (its
        arguments constrained to its schema, as llama-cpp-python), "required" any one of them,
        "auto" what the chat template's model writes, parsed; ``response_format``
        ``{"type": "json_object"}`` (with llama-cpp-python's optional ``"schema"``) or OpenAI's
        ``{"type": "json_schema", "json_schema": {"schema": ...}}`` constrains the output to
        JSON (llama.cpp's grammar), as does ``grammar``; ``logprobs=True`` with ``top_logprobs`` N
        gives OpenAI's chat logprobs."""
        refuse_unsupported("create_chat_completion", locals(), CHAT_NOOP)
        if top_logprobs is not None and not logprobs:
            raise ValueError("create_chat_completion(top_logprobs=...) needs logprobs=True")
        from moa_cpp import tools as T
        if functions is not None and tools is None:          # llama-cpp-python's legacy mapping
            tools = [{"type": "function", "function": f} for f in functions]
        if function_call is not None and tool_choice is None:
            tool_choice = ({"type": "function", "function": {"name": function_call["name"]}}
                           if isinstance(function_call, dict) else function_call)
        plan = T.plan(tools, tool_choice, self.target.chat_template_text)
        gram = request_grammar(grammar, None, response_format)
        if plan.grammar and gram:
            raise ValueError("create_chat_completion: a forced tool call and grammar / response_format each "
                             "constrain the output: give one of them")
        eos = self.target.detokenize([self.target.eos_token], special=True) if self.target.eos_token >= 0 else ""
        out = self._completion(T.template_messages(chat_messages(messages)), True, max_tokens, stop_list(stop) + [eos],
                               stream, model, seed=seed, ignore_eos=ignore_eos,
                               logprobs=(top_logprobs or 0) if logprobs else None, grammar=plan.grammar or gram,
                               tools=plan.tools,
                               **llama_sampling(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                                 presence_penalty, logit_bias))
        if plan.active:
            return tool_chunks(out, plan) if stream else tool_response(chat_response(out), plan)
        return chat_chunks(out) if stream else chat_response(out)

    def _completion(self, prompt: Any, chat: bool, max_tokens: Optional[int], stops: list, stream: bool,
                    model: Optional[str], **kw: Any) -> Any:
        """A text completion (or its chunks) in llama-cpp-python's shape; ``kw``: sampling settings
        and ``logprobs`` (written in the chat or the text shape, as ``chat`` says)."""
        from moa_cpp.logprobs import LogprobWriter
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": model if model is not None else str(self.target.path)}
        ids = self.encode(prompt, chat, kw.pop("tools", None))
        kw.update(max_tokens=self._token_limit(max_tokens, len(ids)), stop=stops)
        writer = LogprobWriter(self.target, chat) if kw.get("logprobs") is not None else None
        if stream:
            return self._chunks(head, ids, kw, writer)
        tokens, text, lps, st = [], [], [], None
        for p in self.stream_steps(ids, **kw):
            tokens += p.tokens
            text.append(p.text)
            lps += p.logprobs
            st = p.stats or st
        return {**head, "choices": [{"text": "".join(text), "index": 0,
                                     "logprobs": writer.part(lps) if writer else None,
                                     "finish_reason": st.finish_reason or "length"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                          "total_tokens": len(ids) + len(tokens)},
                "moa": st.to_dict()}

    def _token_limit(self, max_tokens: Optional[int], n_prompt: int) -> int:
        """llama-cpp-python's limit: None or <= 0 is up to the end of the context, and never past it."""
        room = self.target.n_ctx - n_prompt
        if max_tokens is None or max_tokens <= 0 or max_tokens > room:
            return max(room, 1)      # a prompt that fills the context: the loop refuses it
        return max_tokens

    def _chunks(self, head: dict, prompt: Any, kw: dict, writer: Any = None) -> Iterator[dict]:
        st = None
        for p in self.stream_steps(prompt, **kw):
            st = p.stats or st
            if p.text or p.logprobs or p.stats is None:
                lp = writer.part(p.logprobs) if writer and p.logprobs else None
                yield {**head, "choices": [{"text": p.text, "index": 0, "logprobs": lp, "finish_reason": None}]}
        yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None,
                                    "finish_reason": st.finish_reason if st else "length"}]}

    # ------------------------------------------------------------------ calibration

    def needs_calibration(self) -> bool:
        """True if a cost-aware generation decoded plainly because this target's verify cost
        T(k) was not measured yet (see :meth:`calibrate`)."""
        return self.loop.needs_calibration()

    def calibrate(self) -> None:
        """Measure what the cost-aware default needs (T(k), the exact batch size) once per model,
        build and thread count; cached on disk. Seconds on a small model: call it when no user
        waits (the CLI does after printing its output; a server at start)."""
        from moa_cpp.target.omp_pool import run_in_passing_thread
        self.loop.policy_for(self.draft)
        # on a thread that ends with it: its OpenMP pool must not outlive it (moa_cpp/target/omp_pool.py)
        run_in_passing_thread(self.loop.calibrate)

    def close(self) -> None:
        self.target.close()
