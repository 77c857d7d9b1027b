#!/usr/bin/env python3
"""
derive_archs.py - derive a per-architecture classification of every model
architecture known to a llama.cpp source tree, by *parsing the sources*
(no hand-written architecture list).

Usage:
    python3 derive_archs.py [LLAMA_CPP_TREE] [-o OUT_JSON]

Defaults: tree = /tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp,
          out  = /tmp/survey/archs.json

What is parsed (all paths relative to the tree):

  src/llama-arch.cpp
      LLM_ARCH_NAMES                 enum -> GGUF general.architecture string
      bool llm_arch_*(const llm_arch &) switch functions
                                     (is_recurrent, is_hybrid, is_diffusion,
                                      supports_rs_rollback, supports_sm_tensor, ...)
  src/llama-model.cpp
      llama_model_mapping()          enum -> llama_model_<x> class
      llama_model::create_memory()   enum -> memory kind (nullptr / kv / iswa /
                                     recurrent / hybrid / dsa / msa / dsv4 ...)
      llama_model_rope_type()        enum -> NONE / NORM / NEOX / MROPE / ...
      llama_model_has_encoder/has_decoder()
      (older trees: build_graph() switch with make_unique<llm_build_x>)
  src/models/models.h                class llama_model_<x> : base { struct graph ...;
                                     using graph = other::graph; } declarations
  src/models/*.cpp                   llama_model_<x>::build_arch_graph() bodies and
                                     the graph constructors / member functions; the
                                     attention code in those is analysed textually
                                     (build_attn calls, K/V dataflow, cb() names,
                                     rope ops, inputs, direct cache writes).
  src/llama-kv-cache.cpp             cache tensor names ("cache_%sk_l%d")
  convert_hf_to_gguf.py + conversion/*.py + gguf-py/gguf/constants.py
                                     (Python AST) @ModelBase.register(...) HF class
                                     names -> model_arch -> GGUF arch string, and
                                     whether the converter permutes Q/K rows
                                     (LlamaModel.permute-style, i.e. NORM rope layout).

The C++ analysis is heuristic (regex + brace matching on comment-stripped
text); every derived field is accompanied by the evidence (file:line) it
came from so that it can be checked by hand.
"""
from __future__ import annotations

import ast
import glob
import json
import os
import re
import sys
from collections import OrderedDict, defaultdict

# ----------------------------------------------------------------------------
# generic C++ text helpers
# ----------------------------------------------------------------------------


def strip_comments(text: str) -> str:
    """Blank out // and /* */ comments (keeping newlines and offsets) while
    leaving string / char literals intact."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            q = c
            i += 1
            while i < n and text[i] != q:
                if text[i] == '\\':
                    i += 1
                elif text[i] == '\n':  # unterminated, bail
                    break
                i += 1
            i += 1
            continue
        if c == '/' and i + 1 < n and text[i + 1] == '/':
            while i < n and text[i] != '\n':
                out[i] = ' '
                i += 1
            continue
        if c == '/' and i + 1 < n and text[i + 1] == '*':
            while i < n and not (text[i] == '*' and i + 1 < n and text[i + 1] == '/'):
                if text[i] != '\n':
                    out[i] = ' '
                i += 1
            if i < n:
                out[i] = ' '
                if i + 1 < n:
                    out[i + 1] = ' '
            i += 2
            continue
        i += 1
    return ''.join(out)


def _skip_literal(text: str, i: int) -> int:
    """text[i] is a quote; return index after the closing quote."""
    q = text[i]
    i += 1
    while i < len(text) and text[i] != q:
        if text[i] == '\\':
            i += 1
        i += 1
    return i + 1


def match_close(text: str, i: int, open_c: str = '{', close_c: str = '}') -> int:
    """text[i] == open_c; return index of matching close_c (or len(text))."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in '"\'':
            # do not treat an apostrophe inside digits (1'000) as char literal
            if c == "'" and i > 0 and text[i - 1].isalnum():
                i += 1
                continue
            i = _skip_literal(text, i)
            continue
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def line_of(text: str, pos: int) -> int:
    return text.count('\n', 0, pos) + 1


def split_args(argtext: str) -> list[str]:
    """Split a call's argument text on top-level commas."""
    args, depth, cur = [], 0, []
    i = 0
    while i < len(argtext):
        c = argtext[i]
        if c in '"':
            j = _skip_literal(argtext, i)
            cur.append(argtext[i:j])
            i = j
            continue
        if c in '([{<' and not (c == '<' and not _looks_template(argtext, i)):
            depth += 1
        elif c in ')]}' or (c == '>' and depth > 0 and _in_template_close(argtext, i)):
            depth -= 1
        if c == ',' and depth == 0:
            args.append(''.join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if ''.join(cur).strip():
        args.append(''.join(cur).strip())
    return args


def _looks_template(s: str, i: int) -> bool:
    # crude: a '<' directly after an identifier char and followed by an identifier / 'true'
    return i > 0 and (s[i - 1].isalnum() or s[i - 1] == '_') and re.match(r'<\s*[\w:]+\s*(,|>)', s[i:]) is not None


def _in_template_close(s: str, i: int) -> bool:
    return False  # we never count '>' (templates inside call args are rare and short)


def find_calls(text: str, name_re: str, start: int = 0, end: int | None = None):
    """Yield (pos, name, args_text, end_pos) for calls matching name_re( ... )."""
    end = len(text) if end is None else end
    for m in re.finditer(r'(?<![\w.>:])(' + name_re + r')\s*\(', text[start:end]):
        p = start + m.start()
        op = start + m.end() - 1
        cl = match_close(text, op, '(', ')')
        yield p, m.group(1), text[op + 1:cl], cl


def parse_switch_groups(body: str, base_off: int = 0):
    """Parse the *first* `switch (...) { ... }` in body. Returns a list of
    dicts {labels:[...], default:bool, text:str, start:int} for each group of
    consecutive case labels at the top level of the switch."""
    m = re.search(r'\bswitch\s*\(', body)
    if not m:
        return []
    p = match_close(body, m.end() - 1, '(', ')')
    ob = body.index('{', p)
    cb_ = match_close(body, ob)
    sw = body[ob + 1:cb_]
    # find labels at depth 0 of sw
    labels = []  # (pos, endpos, label)
    depth = 0
    i = 0
    while i < len(sw):
        c = sw[i]
        if c in '"\'':
            if c == "'" and i > 0 and sw[i - 1].isalnum():
                i += 1
                continue
            i = _skip_literal(sw, i)
            continue
        if c == '{':
            depth += 1
        elif c == '}':
            depth -= 1
        elif depth == 0:
            mm = re.match(r'case\s+([\w:]+)\s*:(?!:)|default\s*:', sw[i:])
            if mm and (i == 0 or not (sw[i - 1].isalnum() or sw[i - 1] == '_')):
                labels.append((i, i + mm.end(), mm.group(1) if mm.group(1) else 'default'))
                i += mm.end()
                continue
        i += 1
    groups = []
    cur = None
    for k, (s, e, lab) in enumerate(labels):
        nxt = labels[k + 1][0] if k + 1 < len(labels) else len(sw)
        seg = sw[e:nxt]
        if cur is None:
            cur = {'labels': [], 'default': False, 'text': '', 'start': base_off + ob + 1 + s}
        if lab == 'default':
            cur['default'] = True
        else:
            cur['labels'].append(lab)
        if seg.strip():
            cur['text'] = seg
            cur['text_start'] = base_off + ob + 1 + e
            groups.append(cur)
            cur = None
    if cur is not None:
        groups.append(cur)
    return groups


def find_function(text: str, sig_re: str):
    """Find a function definition whose signature matches sig_re; return
    (body_text, body_start_offset, sig_pos) or (None, None, None)."""
    m = re.search(sig_re, text)
    if not m:
        return None, None, None
    ob = text.index('{', m.end() - 1 if text[m.end() - 1] == '{' else m.end())
    cb_ = match_close(text, ob)
    return text[ob + 1:cb_], ob + 1, m.start()


def top_level_blocks(text: str):
    """Split a translation unit into top-level `signature { body }` blocks.
    Returns list of (signature, body_start, body_end). Namespaces are not
    descended into (the model files do not use them)."""
    res = []
    i, n = 0, len(text)
    last = 0
    while i < n:
        c = text[i]
        if c in '"\'':
            if c == "'" and i > 0 and text[i - 1].isalnum():
                i += 1
                continue
            i = _skip_literal(text, i)
            continue
        if c == '#':  # preprocessor line
            j = text.find('\n', i)
            i = n if j < 0 else j + 1
            last = i
            continue
        if c == ';':
            last = i + 1
        elif c == '{':
            e = match_close(text, i)
            sig = text[last:i].strip()
            res.append((sig, i + 1, e))
            i = e + 1
            # eat trailing ';' of struct definitions
            last = i
            continue
        i += 1
    return res


QUAL3 = re.compile(r'\b(\w+)(?:<[^<>()]*>)?::(\w+)(?:<[^<>()]*>)?::(~?\w+)\s*\(')
QUAL2 = re.compile(r'\b(\w+)(?:<[^<>()]*>)?::(~?\w+)\s*\(')
FREE = re.compile(r'\b(\w+)\s*\($')


def qualify(sig: str):
    """Return (owner, nested, member) for a function signature, e.g.
    ('llama_model_llama', 'graph', 'graph') or ('llama_model_x', None,
    'build_arch_graph') or (None, None, 'free_fn')."""
    head = sig.split('(')[0] + '('
    m = QUAL3.search(head)
    if m:
        return m.group(1), m.group(2), m.group(3)
    m = QUAL2.search(head)
    if m and m.group(1) not in ('std', 'ggml'):
        return m.group(1), None, m.group(2)
    m = re.search(r'\b(\w+)\s*\($', head)
    if m:
        return None, None, m.group(1)
    return None, None, None


# ----------------------------------------------------------------------------
# tree access
# ----------------------------------------------------------------------------


class Tree:
    def __init__(self, root: str):
        self.root = root
        self._raw = {}
        self._clean = {}

    def path(self, rel):
        return os.path.join(self.root, rel)

    def exists(self, rel):
        return os.path.exists(self.path(rel))

    def raw(self, rel):
        if rel not in self._raw:
            with open(self.path(rel), encoding='utf-8', errors='replace') as f:
                self._raw[rel] = f.read()
        return self._raw[rel]

    def clean(self, rel):
        if rel not in self._clean:
            self._clean[rel] = strip_comments(self.raw(rel))
        return self._clean[rel]

    def loc(self, rel, pos):
        return f'{rel}:{line_of(self.clean(rel), pos)}'


# ----------------------------------------------------------------------------
# llama-arch.cpp
# ----------------------------------------------------------------------------


def parse_arch_names(t: Tree):
    rel = 'src/llama-arch.cpp'
    txt = t.clean(rel)
    m = re.search(r'LLM_ARCH_NAMES\s*=\s*\{', txt)
    ob = m.end() - 1
    cb_ = match_close(txt, ob)
    names = OrderedDict()
    lines = {}
    for mm in re.finditer(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]*)"\s*\}', txt[ob:cb_]):
        names[mm.group(1)] = mm.group(2)
        lines[mm.group(1)] = t.loc(rel, ob + mm.start())
    return names, lines


def parse_bool_switch_functions(t: Tree, rel: str, prefix_re: str):
    """Parse every `bool <name>(...) { switch (...) { case ...: return true/false; } }`.
    Returns {fname: {'true': set, 'false': set, 'default': bool|None, 'loc': str}}."""
    txt = t.clean(rel)
    res = {}
    for m in re.finditer(r'\bbool\s+(' + prefix_re + r')\s*\([^)]*\)\s*\{', txt):
        ob = m.end() - 1
        cb_ = match_close(txt, ob)
        body = txt[ob + 1:cb_]
        groups = parse_switch_groups(body, ob + 1)
        info = {'true': set(), 'false': set(), 'default': None, 'loc': t.loc(rel, m.start())}
        for g in groups:
            r = re.search(r'return\s+(true|false)\s*;', g['text'])
            if not r:
                continue
            val = r.group(1) == 'true'
            for lab in g['labels']:
                info['true' if val else 'false'].add(lab)
            if g['default']:
                info['default'] = val
        res[m.group(1)] = info
    return res


def bool_of(info, enum):
    if enum in info['true']:
        return True
    if enum in info['false']:
        return False
    return bool(info['default']) if info['default'] is not None else False


# ----------------------------------------------------------------------------
# llama-model.cpp
# ----------------------------------------------------------------------------


def parse_model_mapping(t: Tree):
    """enum -> model class from llama_model_mapping() (new layout), or enum ->
    llm_build_* struct from build_graph() (old layout)."""
    rel = 'src/llama-model.cpp'
    txt = t.clean(rel)
    out = {}
    body, off, _ = find_function(txt, r'llama_model_mapping\s*\([^)]*\)\s*\{')
    if body is not None:
        for g in parse_switch_groups(body, off):
            m = re.search(r'return\s+new\s+(\w+)\s*\(', g['text'])
            if m:
                for lab in g['labels']:
                    out[lab] = {'model_class': m.group(1), 'loc': t.loc(rel, g['start'])}
        return out, 'model_class'
    # old layout: build_graph switch with make_unique<llm_build_x>
    body, off, _ = find_function(txt, r'llama_model::build_graph\s*\([^)]*\)\s*const\s*\{')
    if body is not None:
        for g in parse_switch_groups(body, off):
            ms = re.findall(r'make_unique\s*<\s*(llm_build_\w+)', g['text'])
            if ms:
                for lab in g['labels']:
                    out[lab] = {'build_structs': sorted(set(ms)), 'loc': t.loc(rel, g['start'])}
    return out, 'llm_build'


def parse_create_memory(t: Tree):
    rel = 'src/llama-model.cpp'
    txt = t.clean(rel)
    body, off, sigpos = find_function(txt, r'llama_model::create_memory\s*\([^)]*\)\s*const\s*\{')
    res = {'explicit': {}, 'default_mentions': defaultdict(list), 'loc': t.loc(rel, sigpos)}
    if body is None:
        return res
    for g in parse_switch_groups(body, off):
        if g['default']:
            # default group: recurrent/hybrid/kv chosen at runtime; collect arch-specific mentions
            seg = g['text']
            seg_off = g.get('text_start', g['start'])
            for mm in re.finditer(r'arch\s*==\s*(LLM_ARCH_\w+)', seg):
                # context: the innermost statement/line containing the mention
                ls = seg.rfind('\n', 0, mm.start()) + 1
                le = seg.find('\n', mm.end())
                ctxline = ' '.join(seg[ls:le].split())
                # find enclosing variable assigned (filter_attn / reuse / share / needs_mem_idx ...)
                res['default_mentions'][mm.group(1)].append(
                    {'line': t.loc(rel, seg_off + mm.start()), 'code': ctxline[:160]})
            res['default_text'] = seg
            res['default_labels'] = g['labels']
        kinds = re.findall(r'new\s+(llama_\w+)\s*\(', g['text'])
        null = re.search(r'res\s*=\s*nullptr', g['text']) is not None
        fall = '[[fallthrough]]' in g['text']
        for lab in g['labels']:
            res['explicit'][lab] = {
                'kinds': sorted(set(kinds)) + (['nullptr'] if null else []),
                'fallthrough_to_default': fall,
                'loc': t.loc(rel, g['start']),
            }
    return res


def parse_return_switch(t: Tree, rel: str, sig_re: str):
    """enum -> returned expression for a `switch (...) { case X: return expr; }` function."""
    txt = t.clean(rel)
    body, off, sigpos = find_function(txt, sig_re)
    out = {}
    default = None
    if body is None:
        return out, None
    for g in parse_switch_groups(body, off):
        rets = [' '.join(r.split()) for r in re.findall(r'return\s+([^;]+);', g['text'])]
        conds = re.findall(r'\bif\s*\(', g['text'])
        expr = rets[0] if len(rets) == 1 and not conds else ' | '.join(rets) + (' (conditional)' if conds else '')
        for lab in g['labels']:
            out[lab] = {'expr': expr, 'loc': t.loc(rel, g['start'])}
        if g['default']:
            default = expr
    return out, default


# ----------------------------------------------------------------------------
# models.h + models/*.cpp
# ----------------------------------------------------------------------------


def parse_models_h(t: Tree):
    """Parse `struct llama_model_x : public base { ... }` declarations.
    Returns {cls: {'base':..., 'graphs': {name: {'kind': 'struct'|'using', 'target':..., 'base':..., 'template':bool}},
                   'declares_build_arch_graph': bool, 'loc':...}} plus {helper struct -> base}."""
    rel = 'src/models/models.h'
    if not t.exists(rel):
        return {}, {}
    txt = t.clean(rel)
    classes = {}
    helpers = {}
    for m in re.finditer(r'\bstruct\s+(\w+)\s*:\s*public\s+([\w:]+)\s*\{', txt):
        name, base = m.group(1), m.group(2)
        ob = m.end() - 1
        cb_ = match_close(txt, ob)
        body = txt[ob + 1:cb_]
        if not name.startswith('llama_model_'):
            helpers[name] = {'base': base, 'loc': t.loc(rel, m.start())}
            continue
        graphs = {}
        # nested struct graph* : public X
        for gm in re.finditer(r'(template\s*<[^>]*>\s*)?struct\s+(graph\w*)\s*:\s*public\s+([\w:<>]+)\s*\{', body):
            graphs[gm.group(2)] = {'kind': 'struct', 'base': gm.group(3),
                                   'template': bool(gm.group(1)), 'loc': t.loc(rel, ob + 1 + gm.start())}
        for um in re.finditer(r'(template\s*<[^>]*>\s*)?using\s+(graph\w*)\s*=\s*([\w:]+?)(?:<([^>]*)>)?\s*;', body):
            graphs[um.group(2)] = {'kind': 'using', 'target': um.group(3), 'targs': um.group(4),
                                   'template': bool(um.group(1)), 'loc': t.loc(rel, ob + 1 + um.start())}
        classes[name] = {'base': base, 'graphs': graphs,
                         'declares_build_arch_graph': 'build_arch_graph' in body,
                         'loc': t.loc(rel, m.start())}
    return classes, helpers


def index_model_sources(t: Tree):
    """Index all top-level functions in src/models/*.cpp.
    Returns list of dicts {file, owner, nested, member, sig, start, end}."""
    funcs = []
    for path in sorted(glob.glob(t.path('src/models/*.cpp'))):
        rel = os.path.relpath(path, t.root)
        txt = t.clean(rel)
        for sig, s, e in top_level_blocks(txt):
            owner, nested, member = qualify(sig)
            if member is None:
                continue
            funcs.append({'file': rel, 'owner': owner, 'nested': nested, 'member': member,
                          'sig': ' '.join(sig.split())[:200], 'start': s, 'end': e})
    return funcs


def resolve_graph(classes, cls, gname, depth=0):
    """Resolve the graph type `gname` as seen from class `cls` to
    (owner_class, struct_name, via) following `using` aliases and base classes."""
    if depth > 10 or cls not in classes:
        return None
    info = classes[cls]
    g = info['graphs'].get(gname)
    if g is not None:
        if g['kind'] == 'struct':
            return cls, gname, []
        target = g['target']
        if '::' in target:
            ocls, oname = target.rsplit('::', 1)
            r = resolve_graph(classes, ocls, oname, depth + 1)
            if r:
                return r[0], r[1], [f'{cls}::{gname} = {target}' + (f'<{g["targs"]}>' if g.get('targs') else '')] + r[2]
        return None
    # inherited from base model class
    r = resolve_graph(classes, info['base'], gname, depth + 1)
    if r:
        return r[0], r[1], [f'{cls} inherits {info["base"]}'] + r[2]
    return None


def find_build_arch_graph(funcs, classes, cls, depth=0):
    for f in funcs:
        if f['owner'] == cls and f['nested'] is None and f['member'] == 'build_arch_graph':
            return cls, f
    if depth < 10 and cls in classes:
        return find_build_arch_graph(funcs, classes, classes[cls]['base'], depth + 1)
    return None, None


# ----------------------------------------------------------------------------
# attention analysis of a graph class
# ----------------------------------------------------------------------------

ROPE_RE = r'ggml_rope(?:_ext|_multi|_custom|_ext_inplace|_inplace|_comp)?|build_rope\w*|\w*apply_rope\w*'
ROPE_OP = re.compile(r'^(?:' + ROPE_RE + r')$')
INPUT_FNS = ['build_attn_inp_kv_iswa', 'build_attn_inp_kv_msa', 'build_attn_inp_kv',
             'build_attn_inp_k_dsa_iswa', 'build_attn_inp_k_dsa', 'build_attn_inp_k_iswa', 'build_attn_inp_k',
             'build_attn_inp_no_cache', 'build_attn_inp_cross', 'build_inp_mem_hybrid_iswa',
             'build_inp_mem_hybrid_k', 'build_inp_mem_hybrid', 'build_inp_dsv4', 'build_inp_kpool',
             'build_rs_inp', 'build_inp_rs']
SWA_INPUTS = {'build_attn_inp_kv_iswa', 'build_attn_inp_k_iswa', 'build_attn_inp_k_dsa_iswa',
              'build_inp_mem_hybrid_iswa'}
K_ONLY_INPUTS = {'build_attn_inp_k', 'build_attn_inp_k_iswa', 'build_attn_inp_k_dsa',
                 'build_attn_inp_k_dsa_iswa', 'build_inp_mem_hybrid_k'}
NO_CACHE_INPUTS = {'build_attn_inp_no_cache'}
SKIP_WORDS = {'ctx0', 'nullptr', 'NULL', 'il', 'model', 'hparams', 'cparams', 'n_tokens', 'n_head', 'n_head_kv',
              'n_embd_head', 'n_rot', 'rope_type', 'n_ctx_orig', 'freq_base', 'freq_scale', 'ext_factor',
              'attn_factor', 'beta_fast', 'beta_slow', 'inp_pos', 'true', 'false', 'const', 'auto', 'int64_t',
              'float', 'layer', 'layers'}


def enclosing_conditions(txt: str, fstart: int, pos: int):
    """Return list of (open_brace_pos, header_text) for the blocks enclosing pos
    inside the function body starting at fstart."""
    stack = []
    i = fstart
    while i < pos:
        c = txt[i]
        if c in '"\'':
            if c == "'" and i > 0 and txt[i - 1].isalnum():
                i += 1
                continue
            i = _skip_literal(txt, i)
            continue
        if c == '{':
            stack.append(i)
        elif c == '}':
            if stack:
                stack.pop()
        i += 1
    out = []
    for ob in stack:
        out.append((ob, block_header(txt, fstart, ob)))
    return out


def block_header(txt, fstart, ob):
    """Text of the statement header that opens the block at txt[ob] == '{',
    e.g. 'if (is_swa)', 'else', 'for (int il = 0; il < n_layer; ++il)'."""
    j = ob - 1
    while j > fstart and txt[j].isspace():
        j -= 1
    if txt[j] == ')':
        # walk back to the matching '('
        depth = 0
        k = j
        while k > fstart:
            if txt[k] == ')':
                depth += 1
            elif txt[k] == '(':
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        kw = re.search(r'(\belse\s+if|\bif\s+constexpr|\bif|\bfor|\bwhile|\bswitch|[\w:<>\[\]&*]+)\s*$', txt[fstart:k])
        start = fstart + kw.start() if kw else k
        return ' '.join(txt[start:j + 1].split())
    k = max(txt.rfind(';', fstart, ob), txt.rfind('{', fstart, ob), txt.rfind('}', fstart, ob))
    return ' '.join(txt[k + 1:ob].split())


def cond_diff(txt, fstart, pos_inner, pos_outer):
    """Conditions that enclose pos_inner but not pos_outer (i.e. the
    assignment is conditional relative to the attention call)."""
    a = enclosing_conditions(txt, fstart, pos_inner)
    b = set(ob for ob, _ in enclosing_conditions(txt, fstart, pos_outer))
    heads = [h for ob, h in a if ob not in b]
    return [h for h in heads if h]


ASSIGN_TMPL = r'(?<![\w.>\]])(?:ggml_tensor\s*\*\s*|auto\s*\*?\s*)?{v}\s*=(?!=)'


def assignments(txt, fstart, fend, var):
    """All assignments to `var` in [fstart, fend): list of (pos, rhs_text, op, is_decl)."""
    out = []
    for m in re.finditer(ASSIGN_TMPL.format(v=re.escape(var)), txt[fstart:fend]):
        p = fstart + m.start()
        rs = fstart + m.end()
        is_decl = bool(re.match(r'(ggml_tensor|auto)', m.group(0)))
        # rhs until ';' at depth 0
        i, depth = rs, 0
        while i < fend:
            c = txt[i]
            if c == '(':
                depth += 1
            elif c == ')':
                depth -= 1
            elif c == ';' and depth <= 0:
                break
            i += 1
        rhs = ' '.join(txt[rs:i].split())
        om = re.match(r'\s*([\w:]+)\s*\(', rhs)
        op = om.group(1) if om else ('=' + rhs if re.match(r'^[\w.\[\]>-]+$', rhs) else 'expr')
        out.append((p, rhs, op, is_decl))
    # structured binding: auto [Qcur, Kcur, Vcur] = build_qkv(...)
    for m in re.finditer(r'auto\s*&?\s*\[([^\]]*)\]\s*=\s*([\w:]+)\s*\(', txt[fstart:fend]):
        names = [x.strip() for x in m.group(1).split(',')]
        if var in names:
            out.append((fstart + m.start(), m.group(0), m.group(2) + f'[{names.index(var)}]', True))
    out.sort()
    return out


def reaches(txt, fstart, a_pos, a_decl, use_pos):
    """Heuristic reaching-definition test: can the assignment at a_pos be the
    value seen at use_pos (a_pos < use_pos)? Excluded are assignments that sit
    in a block that is not open at use_pos when (a) the assignment declares the
    variable (it goes out of scope) or (b) the use sits in an `else` branch of
    the block sequence that contains the assignment (mutually exclusive)."""
    A = enclosing_conditions(txt, fstart, a_pos)
    P = enclosing_conditions(txt, fstart, use_pos)
    k = 0
    while k < len(A) and k < len(P) and A[k][0] == P[k][0]:
        k += 1
    extra_a, extra_p = A[k:], P[k:]
    if not extra_a:
        return True
    if a_decl:
        return False
    if extra_p and extra_p[0][1].startswith('else'):
        return False
    return True


def cb_names(txt, fstart, fend, var):
    return sorted(set(re.findall(r'\bcb\s*\(\s*' + re.escape(var) + r'\s*,\s*"([^"]+)"', txt[fstart:fend])))


def dataflow_has_rope(txt, fstart, fend, var, before, depth=0, seen=None):
    """Does any assignment chain leading to `var` (as seen at position `before`)
    contain a RoPE op? Follows identifiers used on the RHS (depth-limited)."""
    seen = seen if seen is not None else set()
    if depth > 5 or var in seen:
        return []
    seen.add(var)
    hits = []
    for p, rhs, op, decl in assignments(txt, fstart, fend, var):
        if p >= before or not reaches(txt, fstart, p, decl, before):
            continue
        if ROPE_OP.match(op.split('[')[0]) or re.search(r'\b(' + ROPE_RE + r')\s*\(', rhs):
            hits.append((var, p))
        for ident in set(re.findall(r'\b([A-Za-z_]\w*)\b', rhs)):
            if ident in SKIP_WORDS or ident.startswith(('ggml_', 'build_', 'LLM_', 'GGML_')) or ident == var:
                continue
            hits += dataflow_has_rope(txt, fstart, fend, ident, p, depth + 1, seen)
    return hits


def final_name(txt, fstart, fend, var, use_pos, qkv_names):
    """Candidate names (as given by cb(var, "name", il)) of the tensor held by
    `var` at use_pos. An unnamed candidate is reported as '<unnamed OP result>'.
    Events inside blocks that do not enclose use_pos (conditional code) add
    alternatives instead of replacing the current name."""
    events = []
    for p, rhs, op, decl in assignments(txt, fstart, fend, var):
        if p < use_pos and reaches(txt, fstart, p, decl, use_pos):
            nm = None
            mm = re.match(r'(\w+)\[(\d)\]$', op)
            if mm and mm.group(1) == 'build_qkv':
                nm = qkv_names.get(int(mm.group(2)))
            events.append((p, nm or f'<unnamed {op} result>'))
    for m in re.finditer(r'\bcb\s*\(\s*' + re.escape(var) + r'\s*,\s*"([^"]+)"', txt[fstart:use_pos]):
        if reaches(txt, fstart, fstart + m.start(), False, use_pos):
            events.append((fstart + m.start(), m.group(1)))
    events.sort()
    use_blocks = set(ob for ob, _ in enclosing_conditions(txt, fstart, use_pos))
    cands, pend_key, pend_name = set(), None, None
    for p, nm in events:
        key = tuple(ob for ob, _ in enclosing_conditions(txt, fstart, p) if ob not in use_blocks)
        if not key:
            if pend_key is not None:
                pend_key = None
            cands = {nm}
            continue
        if pend_key is not None and key[:len(pend_key)] == pend_key:
            pend_name = nm
        else:
            if pend_key is not None:
                cands.add(pend_name)
            pend_key, pend_name = key, nm
    if pend_key is not None:
        cands.add(pend_name)
    return sorted(cands)


BUILD_ATTN_NAMES = r'build_attn|build_attn_qsa|build_attn_msa_fa|build_attn_mha'


def parse_build_qkv_names(t: Tree):
    """cb() names that llm_graph_context::build_qkv gives its Q/K/V outputs:
    returns ({index: last name}, {index: all names}) with index 0=Q,1=K,2=V."""
    rel = 'src/llama-graph.cpp'
    if not t.exists(rel):
        return {}, {}
    txt = t.clean(rel)
    last, alln = {}, {}
    for m in re.finditer(r'llm_graph_qkv\s+llm_graph_context::build_qkv\s*\(', txt):
        ob = txt.index('{', m.end())
        cb_ = match_close(txt, ob)
        body = txt[ob:cb_]
        r = re.search(r'return\s*\{\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\}', body)
        if not r:
            continue
        for i, v in enumerate(r.groups()):
            names = re.findall(r'\bcb\s*\(\s*' + v + r'\s*,\s*"([^"]+)"', body)
            if names:
                last[i] = names[-1]
                alln[i] = sorted(set(names))
    return last, alln


def analyse_functions(t: Tree, fns):
    """Analyse the attention code inside the given function records."""
    qkv_names, qkv_all = parse_build_qkv_names(t)
    calls = []
    inputs = defaultdict(list)
    direct_writes = []
    markers = defaultdict(list)
    for f in fns:
        rel = f['file']
        txt = t.clean(rel)
        s, e = f['start'], f['end']
        body = txt[s:e]
        for fn in INPUT_FNS:
            for m in re.finditer(r'\b' + fn + r'\s*\(', body):
                inputs[fn].append(t.loc(rel, s + m.start()))
        # direct cache writes (cpy_k / cpy_v / cpy_kv called from the model file)
        for p, name, args, _ in find_calls(txt, r'(?:[\w>\-\.\(\)]*?)(?:cpy_k|cpy_v|cpy_kv)', s, e):
            a = split_args(args)
            direct_writes.append({'call': name.split('>')[-1].split('.')[-1], 'value': a[1] if len(a) > 1 else '?',
                                  'loc': t.loc(rel, p)})
        simple_markers = {
            'attn_sinks': r'\battn_sinks\b',
            'wv_b(mla-decompress)': r'\bwv_b\b',
            'is_mla()': r'\bis_mla\s*\(',
            'kv_cmpr/kv_lora': r'\bkv_cmpr\b|\bkv_lora_rank\b|\bn_lora_kv\b',
            'has_kv(il)': r'\bhas_kv\s*\(',
            'n_layer_kv_from_start': r'\bn_layer_kv_from_start\b',
            'per-layer n_head_kv(il)': r'\bn_head_kv\s*\(\s*il\s*\)',
            'per-layer n_head(il)': r'\bn_head\s*\(\s*il\s*\)',
            'is_swa(il)': r'\bis_swa\s*\(',
            'is_recr(il)': r'\bis_recr\s*\(',
            'n_head_kv==0': r'n_head_kv\w*\s*==\s*0|n_head\s*==\s*0',
            'ggml_rope_multi(mrope)': r'\bggml_rope_multi\s*\(',
            'use_rope/no_rope flag': r'\buse_rope\b|\bn_no_rope_layer_step\b|\bhas_rope\s*\(|\bis_nope\b|\bnope_layer',
            'if constexpr (iswa)': r'if\s+constexpr\s*\(\s*iswa\s*\)',
            'build_rs/ssm (recurrent part)': r'\bbuild_rs\s*\(|\bssm_conv\b|\bbuild_mamba\w*_layer|\bbuild_delta_net\w*|\brwkv\w*time_mix|\bbuild_kda\w*',
            'kq_b (attention bias)': r'\bkq_b\b|pos_bucket',
            'attn_temp_scale': r'\binp_attn_scale\b',
            'indexer cache (lightning/DSA)': r'\bindexer_k\b|\bmctx_lid\b|\bmctx_idx\b|\bget_lid\b',
            'training kv_cur': r'cparams\.training',
        }
        for k, rx in simple_markers.items():
            for m in re.finditer(rx, body):
                markers[k].append(t.loc(rel, s + m.start()))
        # build_attn calls
        for p, name, args, cl in find_calls(txt, BUILD_ATTN_NAMES, s, e):
            a = split_args(args)
            rec = {'fn': name, 'loc': t.loc(rel, p), 'func': f'{f["owner"]}::{f["nested"] + "::" if f["nested"] else ""}{f["member"]}',
                   'nargs': len(a)}
            if name == 'build_attn' and len(a) >= 11:
                rec.update(inp=a[0], q=a[4], k=a[5], v=a[6], kq_b=a[7], sinks=a[8], v_mla=a[9])
                if len(a) >= 13:  # dsa variant has top_k before kq_scale
                    rec['top_k'] = a[10]
            elif name == 'build_attn_mha' and len(a) >= 8:
                rec.update(inp=None, q=a[0], k=a[1], v=a[2], kq_b=a[3], sinks=a[5], v_mla=a[6])
            elif name == 'build_attn_qsa' and len(a) >= 4:
                rec.update(inp=a[0], q=a[1], k=a[2], v=a[3])
            elif name == 'build_attn_msa_fa' and len(a) >= 3:
                rec.update(inp=None, q=a[0], k=a[1], v=a[2])
            else:
                rec['unparsed_args'] = a
                calls.append(rec)
                continue
            for which in ('k', 'v'):
                arg = rec[which]
                var = arg if re.match(r'^\w+$', arg) else None
                if var is None:
                    ids = [x for x in re.findall(r'\b([A-Za-z_]\w*)\b', arg) if x not in SKIP_WORDS and not x.startswith(('ggml_', 'build_'))]
                    var = ids[0] if ids else None
                rec[which + '_var'] = var
                if var in (None, 'nullptr', 'NULL'):
                    rec[which + '_chain'] = []
                    rec[which + '_cb'] = []
                    continue
                chain = []
                for ap, rhs, op, decl in assignments(txt, s, e, var):
                    if ap >= p or not reaches(txt, s, ap, decl, p):
                        continue
                    conds = cond_diff(txt, s, ap, p)
                    chain.append({'op': op, 'loc': t.loc(rel, ap), 'cond': conds})
                rec[which + '_chain'] = chain
                rec[which + '_cb'] = cb_names(txt, s, e, var)
                if any(c['op'].startswith('build_qkv[') for c in chain):
                    idx = {'k': 1, 'v': 2}[which]
                    if qkv_names.get(idx):
                        rec[which + '_cb'] = sorted(set(rec[which + '_cb']) | set(qkv_all.get(idx, [])))
                rec[which + '_final_name'] = final_name(txt, s, e, var, p, qkv_names)
                if which == 'k':
                    hits = dataflow_has_rope(txt, s, e, var, p)
                    rec['k_rope_hits'] = [f'{v_}@{t.loc(rel, hp)}' for v_, hp in hits]
                    rec['k_rope_direct'] = any(ROPE_OP.match(c['op']) for c in chain)
                    # ops on K after the last direct rope op
                    last = max([i for i, c in enumerate(chain) if ROPE_OP.match(c['op'])], default=None)
                    rec['k_post_rope_ops'] = [c['op'] + (f' [{" && ".join(c["cond"])}]' if c['cond'] else '')
                                              for c in chain[last + 1:]] if last is not None else []
                    rope_conds = [c['cond'] for c in chain if ROPE_OP.match(c['op'])]
                    both_branches = any(rc and rc[-1].startswith('else') for rc in rope_conds)
                    rec['k_rope_conditional'] = bool(rope_conds) and all(rc for rc in rope_conds) and not both_branches
                    rec['k_rope_cond_text'] = sorted({' && '.join(rc) for rc in rope_conds if rc})
            calls.append(rec)
    return calls, inputs, direct_writes, markers


# ----------------------------------------------------------------------------
# Python converter (AST)
# ----------------------------------------------------------------------------


def parse_gguf_arch_names(t: Tree):
    rel = 'gguf-py/gguf/constants.py'
    tree = ast.parse(t.raw(rel))
    names = {}
    for node in tree.body:
        tgt = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            tgt, val = node.target.id, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            tgt, val = node.targets[0].id, node.value
        if tgt == 'MODEL_ARCH_NAMES' and isinstance(val, ast.Dict):
            for k, v in zip(val.keys, val.values):
                if isinstance(k, ast.Attribute) and isinstance(v, ast.Constant):
                    names[k.attr] = v.value
    return names


def _attr_chain(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return '.'.join(reversed(parts))


HEAD_ARG = re.compile(r'head|n_kv|num_heads', re.I)


def parse_converter(t: Tree):
    files = []
    if t.exists('convert_hf_to_gguf.py'):
        files.append('convert_hf_to_gguf.py')
    files += sorted(os.path.relpath(p, t.root) for p in glob.glob(t.path('conversion/*.py')))
    classes = {}
    for rel in files:
        try:
            tree = ast.parse(t.raw(rel))
        except SyntaxError as ex:
            print(f'warn: cannot parse {rel}: {ex}', file=sys.stderr)
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            c = {'file': rel, 'line': node.lineno, 'bases': [_attr_chain(b) for b in node.bases],
                 'registers': [], 'model_arch': None, 'dynamic_arch': [], 'undo_permute': None,
                 'permute_calls': [], 'methods': {}}
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == 'register':
                    c['registers'] += [a.value for a in dec.args if isinstance(a, ast.Constant)]
            for st in node.body:
                if isinstance(st, (ast.Assign, ast.AnnAssign)):
                    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                    for tg in targets:
                        if isinstance(tg, ast.Name) and tg.id == 'model_arch' and st.value is not None:
                            c['model_arch'] = _attr_chain(st.value).split('.')[-1]
                        if isinstance(tg, ast.Name) and tg.id == 'undo_permute' and isinstance(st.value, ast.Constant):
                            c['undo_permute'] = st.value.value
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    calls_super = set()
                    explicit = set()
                    for sub in ast.walk(st):
                        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                            # super().meth(...)
                            if isinstance(sub.func.value, ast.Call) and isinstance(sub.func.value.func, ast.Name) \
                                    and sub.func.value.func.id == 'super':
                                calls_super.add(sub.func.attr)
                            # explicit Base.meth(self, ...) (used with multiple inheritance)
                            if isinstance(sub.func.value, ast.Name) and sub.args and \
                                    isinstance(sub.args[0], ast.Name) and sub.args[0].id == 'self':
                                explicit.add((sub.func.value.id, sub.func.attr))
                            if sub.func.attr in ('permute', '_reverse_hf_permute'):
                                argsrc = [ast.unparse(a) for a in sub.args]
                                owner = _attr_chain(sub.func.value) if not isinstance(sub.func.value, ast.Call) else 'expr'
                                # head-permutes take (weights, n_head[, n_head_kv]) - tensor.permute(0,2,1,3) does not
                                if len(argsrc) >= 2 and any(HEAD_ARG.search(x) for x in argsrc[1:]):
                                    c['permute_calls'].append({'method': st.name, 'line': sub.lineno,
                                                               'call': f'{owner}.{sub.func.attr}({", ".join(argsrc)[:80]})'})
                        if isinstance(sub, ast.Assign):
                            for tg in sub.targets:
                                if isinstance(tg, ast.Attribute) and tg.attr == 'model_arch' and \
                                        isinstance(tg.value, ast.Name) and tg.value.id == 'self':
                                    vals = [n.attr for n in ast.walk(sub.value) if isinstance(n, ast.Attribute)
                                            and isinstance(n.value, ast.Attribute) and n.value.attr == 'MODEL_ARCH']
                                    c['dynamic_arch'] += vals or ['<expr>']
                    c['methods'][st.name] = {'calls_super': sorted(calls_super), 'explicit': sorted(explicit)}
                    if st.name == '__init__' and any(isinstance(x, ast.Raise) for x in ast.walk(st)) and \
                            not any(isinstance(x, (ast.If, ast.Try)) for x in st.body):
                        c['init_raises'] = True
            # keep the first definition of a class name (no duplicates expected)
            classes.setdefault(node.name, c)

    def mro(name):
        """C3 linearisation (Python's MRO) over the parsed classes; unknown
        bases (e.g. IntEnum, torch classes) are dropped."""
        memo = mro.__dict__.setdefault('memo', {})
        if name in memo:
            return memo[name]
        if name not in classes:
            return []
        memo[name] = [name]  # recursion guard
        seqs = [list(mro(b.split('.')[-1])) for b in classes[name]['bases'] if b.split('.')[-1] in classes]
        seqs.append([b.split('.')[-1] for b in classes[name]['bases'] if b.split('.')[-1] in classes])
        res = [name]
        while True:
            seqs = [q for q in seqs if q]
            if not seqs:
                break
            for q in seqs:
                head = q[0]
                if not any(head in r[1:] for r in seqs):
                    break
            else:  # inconsistent hierarchy: fall back to DFS order
                for q in seqs:
                    for x in q:
                        if x not in res:
                            res.append(x)
                break
            res.append(head)
            for q in seqs:
                if q and q[0] == head:
                    q.pop(0)
        memo[name] = res
        return res

    def eff(name, key):
        for c in mro(name):
            v = classes[c][key]
            if v is not None:
                return v, c
        return None, None

    def resolve_calls(start_cls, m, order, pos, seen):
        """Classes whose own `m` body executes when `m` is dispatched on an
        object whose MRO is `order`, starting the lookup at order[pos]."""
        out = []
        for k in range(pos, len(order)):
            d = order[k]
            if m not in classes[d]['methods']:
                continue
            if (d, m) in seen:
                return out
            seen.add((d, m))
            out.append(d)
            info = classes[d]['methods'][m]
            if m in info['calls_super']:
                out += resolve_calls(start_cls, m, order, k + 1, seen)
            for ex, em in info['explicit']:
                if em == m and ex in classes:
                    # Base.m(self): lookup starts at Base inside the instance MRO
                    if ex in order:
                        out += resolve_calls(start_cls, m, order, order.index(ex), seen)
                    else:
                        o2 = mro(ex)
                        out += resolve_calls(start_cls, m, o2, 0, seen)
            return out
        return out

    def permute_status(name):
        """('yes' | 'yes (inherited)' | 'nvfp4 path only' | 'no ...', detail):
        does converting through class `name` execute a head-permute of Q/K?"""
        order = mro(name)
        up, up_from = eff(name, 'undo_permute')
        own = classes[name]['permute_calls']
        if own:
            return 'yes', f'{name}: ' + '; '.join(p['call'] + f' in {p["method"]}() {classes[name]["file"]}:{p["line"]}'
                                                  for p in own[:2])
        hits = []
        for cname in order[1:]:
            for pc in classes[cname]['permute_calls']:
                m = pc['method']
                if cname in resolve_calls(name, m, order, 0, set()):
                    hits.append((cname, m))
        if not hits:
            perm_anc = [c for c in order[1:] if classes[c]['permute_calls']]
            return 'no', (f'{perm_anc[0]} permutes but the override chain of {name} never reaches it' if perm_anc else '')
        methods = sorted({m for _, m in hits})
        main = [m for m in methods if not m.startswith('_repack')]
        det = f'via {hits[0][0]}.{"/".join(methods)} (undo_permute={up} from {up_from})'
        if up is False:
            return 'no (undo_permute=False)', det
        if not main:
            return 'nvfp4 path only', det
        return 'yes (inherited)', det


    gguf_names = parse_gguf_arch_names(t)
    hf_map = []
    for name, c in classes.items():
        if not c['registers']:
            continue
        arch, arch_from = eff(name, 'model_arch')
        # only the class's own __init__/methods: an inherited conditional switch
        # (e.g. LlamaModel -> EAGLE3) would otherwise leak into every subclass
        dyn = [d for d in c['dynamic_arch'] if d != '<expr>']
        status, detail = permute_status(name)
        for hf in c['registers']:
            hf_map.append({'hf_class': hf, 'converter_class': name, 'file': f'{c["file"]}:{c["line"]}',
                           'model_type': 'mmproj' if arch == 'MMPROJ' else 'text',
                           'model_arch': arch, 'gguf_arch': gguf_names.get(arch, None),
                           'dynamic_arch': sorted({gguf_names.get(d, d) for d in dyn}),
                           'dynamic_arch_unresolved': '<expr>' in c['dynamic_arch'],
                           'permutes_qk': status, 'permute_detail': detail,
                           'init_raises': c.get('init_raises', False)})
    unregistered = []
    for name, c in classes.items():
        if c['registers'] or not c['model_arch'] or c['model_arch'] == 'MMPROJ':
            continue
        status, detail = permute_status(name)
        unregistered.append({'converter_class': name, 'file': f'{c["file"]}:{c["line"]}',
                             'gguf_arch': gguf_names.get(c['model_arch']), 'permutes_qk': status,
                             'permute_detail': detail})
    return hf_map, gguf_names, unregistered


# ----------------------------------------------------------------------------
# KV-cache write path facts (quoted with file:line)
# ----------------------------------------------------------------------------


def grep_lines(t: Tree, rel, rx, maxn=50):
    out = []
    raw = t.raw(rel).split('\n')
    for i, l in enumerate(raw, 1):
        if re.search(rx, l):
            out.append(f'{rel}:{i}: {l.strip()}')
            if len(out) >= maxn:
                break
    return out


def kv_cache_facts(t: Tree):
    facts = {}
    rel = 'src/llama-kv-cache.cpp'
    if t.exists(rel):
        facts['cache_tensor_names'] = grep_lines(t, rel, r'ggml_format_name\((k|v), "cache_')
        facts['cpy_k_cpy_v'] = grep_lines(t, rel, r'::cpy_k\(|::cpy_v\(|ggml_set_rows\(|k_cur = ggml_view_2d|v_cur = ggml_view_2d|ggml_reshape_2d\(ctx, v(_cur)?,|ggml_cont_2d|ggml_pad\(ctx, v_cur|if \(!v_trans\)')
        facts['hadamard_rotation'] = grep_lines(t, rel, r'attn_rot_k\s*=|attn_rot_v\s*=|ggml_is_quantized\(type_[kv]\)|LLAMA_ATTN_ROT_DISABLE"')
        facts['name_tag_ctor'] = grep_lines(t, 'src/llama-kv-cache.h', r'name_tag')
    rel = 'ggml/src/ggml.c'
    if t.exists(rel):
        txt = t.raw(rel)
        m = re.search(r'struct ggml_tensor \* ggml_set_rows\(', txt)
        if m:
            ln = line_of(txt, m.start())
            lines = txt.split('\n')[ln - 1:ln + 27]
            facts['ggml_set_rows'] = [f'{rel}:{ln + i}: {l.strip()}' for i, l in enumerate(lines)
                                      if re.search(r'ggml_set_rows|view_tensor|->op|->src\[', l)]
        facts['view_naming'] = grep_lines(t, rel, r'"%s \((view|reshaped)\)"', 3)
    rel = 'src/llama-graph.cpp'
    if t.exists(rel):
        facts['build_attn_writes'] = grep_lines(t, rel, r'mctx_cur->cpy_[kv]\(|llama_mul_mat_hadamard\(ctx0, [kv]_cur|rope fusion')
    rel = 'src/llama-context.cpp'
    if t.exists(rel):
        facts['cb_naming'] = grep_lines(t, rel, r'ggml_format_name\(cur, "%s-%d"', 3)
    rel = 'src/llama-memory-recurrent.cpp'
    if t.exists(rel):
        txt = t.raw(rel)
        m = re.search(r'bool llama_memory_recurrent::seq_rm\(', txt)
        if m:
            ln = line_of(txt, m.start())
            ob = txt.index('{', m.start())
            cb_ = match_close(strip_comments(txt), ob)
            body = txt[m.start():cb_].split('\n')
            facts['recurrent_seq_rm_returns'] = [f'{rel}:{ln + i}: {l.strip()}' for i, l in enumerate(body)
                                                 if re.search(r'return|if \(|rollback|can\'t|partial', l)]
    for rel in sorted(glob.glob(t.path('src/llama-memory-hybrid*.cpp'))) + sorted(glob.glob(t.path('src/llama-kv-cache-*.cpp'))):
        rel = os.path.relpath(rel, t.root)
        txt = t.raw(rel)
        m = re.search(r'bool (\w+)::seq_rm\(', txt)
        if m:
            ln = line_of(txt, m.start())
            ob = txt.index('{', m.start())
            cb_ = match_close(strip_comments(txt), ob)
            body = txt[m.start():cb_ + 1].split('\n')
            facts.setdefault('other_seq_rm', []).append(
                [f'{rel}:{ln + i}: {l.strip()}' for i, l in enumerate(body) if l.strip()][:12])
    rel = 'include/llama.h'
    if t.exists(rel):
        facts['llama_h_state_seq'] = grep_lines(t, rel, r'LLAMA_STATE_SEQ_FLAGS_|llama_state_seq_\w+\(|llama_memory_seq_rm\(|Returns false if a partial')
    return facts


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------


def main():
    args = sys.argv[1:]
    out_path = '/tmp/survey/archs.json'
    if '-o' in args:
        i = args.index('-o')
        out_path = args[i + 1]
        del args[i:i + 2]
    root = args[0] if args else '/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp'
    t = Tree(root)

    names, name_lines = parse_arch_names(t)
    preds = parse_bool_switch_functions(t, 'src/llama-arch.cpp', r'llm_arch_\w+')
    mapping, layout = parse_model_mapping(t)
    mem = parse_create_memory(t)
    rope_types, rope_default = parse_return_switch(t, 'src/llama-model.cpp', r'llama_rope_type\s+llama_model_rope_type\s*\([^)]*\)\s*\{')
    has_enc, _ = parse_return_switch(t, 'src/llama-model.cpp', r'bool\s+llama_model_has_encoder\s*\([^)]*\)\s*\{')
    has_dec, has_dec_default = parse_return_switch(t, 'src/llama-model.cpp', r'bool\s+llama_model_has_decoder\s*\([^)]*\)\s*\{')
    classes, helpers = parse_models_h(t)
    funcs = index_model_sources(t)
    hf_map, gguf_names, conv_unreg = parse_converter(t)

    hf_by_arch = defaultdict(list)
    unreg_by_arch = defaultdict(list)
    for u in conv_unreg:
        if u['gguf_arch']:
            unreg_by_arch[u['gguf_arch']].append(u)
    for h in hf_map:
        if h['model_type'] == 'mmproj' or h['init_raises']:
            continue
        keys = set()
        if h['gguf_arch']:
            keys.add(h['gguf_arch'])
        keys |= set(h['dynamic_arch'])
        for k in keys:
            hf_by_arch[k].append(h)

    archs = OrderedDict()
    for enum, name in names.items():
        if enum == 'LLM_ARCH_UNKNOWN':
            continue
        a = OrderedDict()
        a['name'] = name
        a['enum'] = enum
        a['defined_at'] = name_lines[enum]
        # predicates
        a['recurrent'] = bool_of(preds['llm_arch_is_recurrent'], enum) if 'llm_arch_is_recurrent' in preds else None
        a['hybrid'] = bool_of(preds['llm_arch_is_hybrid'], enum) if 'llm_arch_is_hybrid' in preds else None
        a['diffusion'] = bool_of(preds['llm_arch_is_diffusion'], enum) if 'llm_arch_is_diffusion' in preds else None
        a['other_predicates'] = {k: bool_of(v, enum) for k, v in preds.items()
                                 if k not in ('llm_arch_is_recurrent', 'llm_arch_is_hybrid', 'llm_arch_is_diffusion')}
        a['has_encoder'] = (has_enc.get(enum, {}).get('expr') == 'true')
        dexpr = has_dec.get(enum, {}).get('expr', has_dec_default)
        a['has_decoder'] = dexpr == 'true'
        a['rope_type'] = rope_types.get(enum, {}).get('expr', f'<not in switch; default: {rope_default}>')
        # memory
        em = mem['explicit'].get(enum)
        if em and not em['fallthrough_to_default']:
            a['memory'] = em['kinds']
        else:
            kinds = (em['kinds'] if em else [])
            if a['recurrent']:
                kinds = kinds + ['llama_memory_recurrent']
            elif a['hybrid']:
                kinds = kinds + ['llama_memory_hybrid(_iswa/_idx)']
            else:
                kinds = kinds + ['llama_kv_cache | llama_kv_cache_iswa (if hparams.swa_type != NONE)']
            a['memory'] = kinds
        a['memory_special'] = [f'{m["line"]}: {m["code"]}' for m in mem['default_mentions'].get(enum, [])]
        a['no_kv_cache'] = bool(em and 'nullptr' in em['kinds'])
        # builder
        mp = mapping.get(enum)
        a['model_class'] = mp.get('model_class') if mp else None
        graphs = []
        if layout == 'model_class' and mp:
            cls = mp['model_class']
            bcls, bfn = find_build_arch_graph(funcs, classes, cls)
            if bfn is None:
                a['builder'] = None
            else:
                btxt = t.clean(bfn['file'])[bfn['start']:bfn['end']]
                a['build_arch_graph'] = f'{bfn["file"]}:{line_of(t.clean(bfn["file"]), bfn["start"])}' + \
                    (f' (inherited from {bcls})' if bcls != cls else '')
                if re.search(r'GGML_ABORT|throw\s', btxt) and 'make_unique' not in btxt:
                    a['builder_note'] = 'build_arch_graph aborts/throws (no inference graph)'
                for gm in re.finditer(r'make_unique\s*<\s*(graph\w*)\s*(?:<\s*([^>]*)>)?\s*>', btxt):
                    r = resolve_graph(classes, bcls, gm.group(1))
                    if r is None:
                        continue
                    owner, sname, via = r
                    # condition of this alternative (MTP / encoder / swa template arg)
                    ctx_ = btxt[max(0, btxt.rfind('\n', 0, max(0, btxt.rfind('if', 0, gm.start()))) ):gm.start()]
                    kind = 'mtp' if 'mtp' in sname else ('encoder' if gm.group(2) == 'true' and re.search(r'ENCODER', btxt) else 'main')
                    defs = [f for f in funcs if f['owner'] == owner and f['nested'] == sname]
                    if not defs:  # e.g. graph defined in header only
                        defs = [f for f in funcs if f['owner'] == owner and f['member'] == sname]
                    files = sorted({f['file'] for f in defs})
                    graphs.append({'type': f'{owner}::{sname}' + (f'<{gm.group(2)}>' if gm.group(2) else ''),
                                   'kind': kind, 'files': files, 'via': via,
                                   'struct_base': classes.get(owner, {}).get('graphs', {}).get(sname, {}).get('base')})
            # dedupe
            seen, g2 = set(), []
            for g in graphs:
                if g['type'] not in seen:
                    seen.add(g['type'])
                    g2.append(g)
            graphs = g2
        elif mp:
            for s_ in mp.get('build_structs', []):
                graphs.append({'type': s_, 'kind': 'main', 'files': [], 'via': []})
        a['graphs'] = graphs
        main_graphs = [g for g in graphs if g['kind'] != 'mtp'] or graphs
        a['builder'] = ', '.join(g['type'] for g in main_graphs) if main_graphs else None
        a['builder_files'] = sorted({f for g in main_graphs for f in g['files']})

        # collect functions of the main graph structs (+ graph base structs that are model graphs)
        fns = []
        owners = set()
        for g in main_graphs:
            tp = re.sub(r'<.*>$', '', g['type'])
            if '::' not in tp:
                continue
            owner, sname = tp.split('::', 1)
            todo = [(owner, sname)]
            while todo:
                o, s_ = todo.pop()
                if (o, s_) in owners:
                    continue
                owners.add((o, s_))
                fns += [f for f in funcs if f['owner'] == o and f['nested'] == s_]
                base = classes.get(o, {}).get('graphs', {}).get(s_, {}).get('base') or ''
                if '::' in base:
                    bo, bs = re.sub(r'<.*>$', '', base).split('::', 1)
                    todo.append((bo, bs))
                elif base == 'graph':
                    todo.append((o, 'graph'))
        # free static helpers in the same files that are referenced from the graph code
        used_text = ' '.join(t.clean(f['file'])[f['start']:f['end']] for f in fns)
        for f in funcs:
            if f['owner'] is None and f['file'] in a['builder_files'] and re.search(r'\b' + re.escape(f['member']) + r'\s*\(', used_text):
                fns.append(f)
        calls, inputs, dwrites, markers = analyse_functions(t, fns)
        mtp_graphs = [g for g in graphs if g['kind'] == 'mtp']
        a['mtp_graph'] = ', '.join(g['type'] for g in mtp_graphs) or None

        attn_calls = [c for c in calls if c['fn'] == 'build_attn']
        inp_used = sorted(inputs)
        a['attn_inputs'] = inp_used
        a['n_build_attn_calls'] = len(attn_calls)
        a['other_attn_calls'] = sorted({c['fn'] for c in calls if c['fn'] != 'build_attn'})
        a['uses_attention'] = bool(calls)
        a['encoder_only_no_cache'] = a['no_kv_cache'] or (bool(inputs) and set(inp_used) <= NO_CACHE_INPUTS)
        a['encoder_decoder'] = a['has_encoder'] and a['has_decoder'] or 'build_attn_inp_cross' in inputs
        # swa: graph side (iswa inputs) + hparams side (load_arch_hparams sets swa_type)
        swa_graph = bool(set(inp_used) & SWA_INPUTS)
        hp_txt = ''
        c_ = a['model_class']
        for _ in range(10):
            hp_fns = [f for f in funcs if f['owner'] == c_ and f['member'] == 'load_arch_hparams']
            if hp_fns or c_ not in classes:
                break
            c_ = classes[c_]['base']
        hp_txt = ' '.join(t.clean(f['file'])[f['start']:f['end']] for f in hp_fns)
        swa_hp = sorted(set(re.findall(r'swa_type\s*=\s*(LLAMA_SWA_TYPE_\w+)', hp_txt)))
        if re.search(r'set_swa_pattern|load_swa_pattern', hp_txt):
            swa_hp.append('swa_pattern')
        hp_types = [x for x in swa_hp if x.startswith('LLAMA_SWA_TYPE_')]
        hp_always = bool(hp_types) and 'LLAMA_SWA_TYPE_NONE' not in hp_types
        hp_maybe = any(x != 'LLAMA_SWA_TYPE_NONE' for x in hp_types) or 'swa_pattern' in swa_hp
        non_swa_inputs = set(inp_used) & {'build_attn_inp_kv', 'build_inp_mem_hybrid', 'build_attn_inp_k',
                                          'build_inp_mem_hybrid_k', 'build_attn_inp_k_dsa'}
        if (swa_graph and not non_swa_inputs and not markers.get('if constexpr (iswa)')) or \
                (hp_always and not non_swa_inputs):
            a['swa'] = 'always'
        elif swa_graph or hp_maybe:
            a['swa'] = 'optional'
        else:
            a['swa'] = 'no'
        a['swa_types'] = hp_types
        a['swa_hparams'] = swa_hp
        # mla
        k_only = bool(set(inp_used) & K_ONLY_INPUTS)
        a['mla'] = ('yes' if k_only and not markers.get('is_mla()') else
                    'conditional(is_mla)' if k_only else
                    'no')
        a['mla_evidence'] = sorted(set(inp_used) & K_ONLY_INPUTS) + \
            (['build_attn(..., v_mla=wv_b)'] if any((c.get('v_mla') or '').endswith('wv_b') for c in calls) else [])
        # sinks
        sinks_args = sorted({c.get('sinks') for c in calls if c.get('sinks') not in (None, 'nullptr', 'NULL')})
        a['sinks'] = sinks_args
        # K/V names and rope
        a['k_vars'] = sorted({c.get('k_var') or 'None' for c in calls if 'k' in c})
        a['v_vars'] = sorted({c.get('v_var') or 'None' for c in calls if 'v' in c})
        a['kcur_names'] = sorted({n for c in calls for n in c.get('k_cb', [])})
        a['vcur_names'] = sorted({n for c in calls for n in c.get('v_cb', [])})
        # RoPE / K naming is judged on the cache-writing build_attn() calls; the
        # other attention helpers (build_attn_mha/qsa/msa_fa) usually read K back
        # from the cache, so they are only used when there is no build_attn call.
        real_k = [c for c in calls if c['fn'] == 'build_attn' and 'k' in c and c.get('k_var') not in (None, 'nullptr', 'NULL')]
        if not real_k:
            real_k = [c for c in calls if 'k' in c and c.get('k_var') not in (None, 'nullptr', 'NULL')]

        def arch_cond(cond):
            """Evaluate a condition that only compares the architecture, e.g.
            'if (model.arch == LLM_ARCH_A || model.arch == LLM_ARCH_B)'.
            Returns True/False, or None if it depends on anything else."""
            body = re.sub(r'^(else\s+)?if\s*\((.*)\)$', r'\2', cond.strip())
            terms = [x.strip() for x in body.split('||')]
            vals = []
            for term in terms:
                m_ = re.fullmatch(r'\(?\s*(?:model\.|model->|this->)?arch\s*(==|!=)\s*(LLM_ARCH_\w+)\s*\)?', term)
                if not m_:
                    return None
                vals.append((enum == m_.group(2)) == (m_.group(1) == '=='))
            return any(vals)

        roped = []
        for c in real_k:
            if not c.get('k_rope_hits'):
                continue
            conds = c.get('k_rope_cond_text', [])
            if conds and all(arch_cond(x) is False for x in conds):
                continue  # rope only for other architectures sharing this graph
            if conds and all(arch_cond(x) is True for x in conds):
                c = dict(c, k_rope_conditional=False, k_rope_cond_text=[])
            roped.append(c)
        a['uses_rope'] = ('yes' if real_k and len(roped) == len(real_k) and not any(c.get('k_rope_conditional') for c in roped)
                          else 'partial/conditional' if roped
                          else 'no' if real_k else 'n/a')
        a['k_rope_conditions'] = sorted({x for c in roped for x in c.get('k_rope_cond_text', [])})
        a['k_rope_indirect'] = sorted({h.split('@')[0] for c in roped for h in c['k_rope_hits'] if not c.get('k_rope_direct')})
        a['k_post_rope_ops'] = sorted({op for c in real_k for op in c.get('k_post_rope_ops', [])})
        a['k_chain'] = sorted({' -> '.join(x['op'] for x in c['k_chain']) for c in real_k})
        a['k_final_names'] = sorted({n for c in real_k for n in (c.get('k_final_name') or [])})
        a['v_final_names'] = sorted({n for c in real_k if c.get('v_var') not in (None, 'nullptr', 'NULL')
                                     for n in (c.get('v_final_name') or [])})
        a['kv_not_stored_calls'] = [c['loc'] for c in calls if c['fn'] == 'build_attn' and c.get('k_var') in (None, 'nullptr', 'NULL')]
        a['direct_cache_writes'] = [f'{d["call"]}({d["value"]}) @ {d["loc"]}' for d in dwrites]
        dw_calls = {d['call'] for d in dwrites}
        a['k_only_cache'] = a['mla'] != 'no' or ('cpy_k' in dw_calls and 'cpy_v' not in dw_calls
                                                 and not any(c['fn'] == 'build_attn' and 'build_attn_inp_kv' in (c.get('inp') or '') for c in calls))
        a['markers'] = {k: v[:4] for k, v in markers.items()}
        # irregularities / capture blockers
        notes = []
        if not a['uses_attention']:
            notes.append('no attention (pure recurrent or no graph)')
        if a['kv_not_stored_calls']:
            notes.append('KV shared across layers: some build_attn calls pass k=v=nullptr (layer reuses an earlier layer\'s cache)')
        if a['memory_special'] and any('reuse' in m or 'share' in m for m in a['memory_special']):
            notes.append('create_memory: layer reuse/share callback')
        if markers.get('per-layer n_head_kv(il)'):
            notes.append('per-layer n_head_kv(il)')
        if markers.get('n_head_kv==0'):
            notes.append('layers with n_head(_kv)==0 (attention-free / linear-attn layers)')
        if markers.get('has_kv(il)'):
            notes.append('has_kv(il) gating')
        if a['mla'] != 'no':
            notes.append(('MLA' if a['mla'] == 'yes' else 'MLA when hparams.is_mla()') +
                         ': K-only cache, K = [kv_lora latent ++ ' + ('roped ' if a['uses_rope'] != 'no' else 'NoPE ') +
                         'k_pe] as 1 head, V = view of K\'s first kv_lora_rank dims, per-head V only after wv_b')
        if a['sinks']:
            notes.append('attention sinks')
        if a['direct_cache_writes']:
            notes.append('model code writes cache directly (cpy_k/cpy_v outside build_attn)')
        if markers.get('indexer cache (lightning/DSA)'):
            notes.append('extra indexer-key cache (also named cache_k_l<il>)')
        if a['other_attn_calls']:
            notes.append('non-standard attention: ' + ', '.join(a['other_attn_calls']))
        if markers.get('ggml_rope_multi(mrope)'):
            notes.append('M-RoPE (ggml_rope_multi, 4 position streams)')
        if a['k_post_rope_ops']:
            notes.append('ops on K after RoPE: ' + '; '.join(a['k_post_rope_ops']))
        if a['uses_rope'] == 'partial/conditional':
            notes.append('RoPE conditional (per layer or per model variant): ' + '; '.join(a['k_rope_conditions'])[:160])
        if a['k_rope_indirect']:
            notes.append('RoPE applied to a part of K before concat (' + ', '.join(a['k_rope_indirect']) + ')')
        if a['diffusion']:
            notes.append('diffusion (non-causal, no KV cache)')
        if a['encoder_decoder']:
            notes.append('encoder-decoder / has encoder')
        if markers.get('build_rs/ssm (recurrent part)') or a['recurrent'] or a['hybrid']:
            if a['uses_attention']:
                notes.append('hybrid: recurrent state + attention layers')
            else:
                notes.append('recurrent state only')
        if a['mtp_graph']:
            notes.append('has MTP/NextN draft graph: ' + a['mtp_graph'])
        if a.get('builder_note'):
            notes.append(a['builder_note'])
        if layout == 'model_class' and not a['model_class'] and enum in names and name != 'clip':
            notes.append('NOT in llama_model_mapping(): loading throws "unsupported model architecture"')
        a['notes'] = notes
        a['converter'] = [{k: h[k] for k in ('hf_class', 'converter_class', 'file', 'permutes_qk')}
                          for h in sorted(hf_by_arch.get(name, []), key=lambda x: x['hf_class'])]
        a['converter_unregistered'] = [{k: u[k] for k in ('converter_class', 'file', 'permutes_qk')}
                                       for u in unreg_by_arch.get(name, [])]
        verdicts = sorted({h['permutes_qk'] for h in a['converter']} | {u['permutes_qk'] for u in a['converter_unregistered']})
        a['converter_permutes_qk'] = verdicts
        if any(v.startswith('yes') for v in verdicts) and 'NEOX' in a['rope_type'] and 'NORM' not in a['rope_type']:
            a['notes'].append('converter permute inherited but llama.cpp rope is NEOX: permute probably never '
                              'triggers (name-based q_proj/k_proj match) - check by hand')
        archs[name] = a

    # categories
    cats = OrderedDict()

    def cat(k, pred):
        cats[k] = [n for n, a in archs.items() if pred(a)]
    cat('total', lambda a: True)
    cat('recurrent', lambda a: a['recurrent'])
    cat('hybrid', lambda a: a['hybrid'])
    cat('diffusion', lambda a: a['diffusion'])
    cat('no_kv_cache(create_memory=nullptr)', lambda a: a['no_kv_cache'])
    cat('has_encoder', lambda a: a['has_encoder'])
    cat('encoder_only(no decoder)', lambda a: not a['has_decoder'])
    cat('no_attention', lambda a: not a['uses_attention'])
    cat('mla(K-only cache)', lambda a: a['mla'] != 'no')
    cat('swa_always', lambda a: a['swa'] == 'always')
    cat('swa_optional', lambda a: a['swa'] == 'optional')
    cat('sinks', lambda a: bool(a['sinks']))
    cat('rope_yes', lambda a: a['uses_rope'] == 'yes')
    cat('rope_partial', lambda a: a['uses_rope'] == 'partial/conditional')
    cat('rope_no', lambda a: a['uses_rope'] == 'no')
    cat('rope_type_NONE(llama_model_rope_type)', lambda a: 'NONE' in a['rope_type'])
    cat('kv_shared_layers', lambda a: bool(a['kv_not_stored_calls']))
    cat('post_rope_ops_on_K', lambda a: bool(a['k_post_rope_ops']))
    cat('direct_cache_writes', lambda a: bool(a['direct_cache_writes']))
    cat('mtp_graph', lambda a: bool(a['mtp_graph']))
    cat('k_only_cache', lambda a: a['k_only_cache'])
    cat('standard_kv_write_path', lambda a: a['uses_attention'] and not a['no_kv_cache'] and a['mla'] == 'no'
        and not a['recurrent'] and not a['hybrid'] and not a['kv_not_stored_calls'] and not a['direct_cache_writes']
        and not a['other_attn_calls'] and a['has_decoder'] and not a.get('builder_note'))

    result = OrderedDict()
    result['tree'] = root
    result['layout'] = layout
    result['counts'] = {k: len(v) for k, v in cats.items()}
    result['categories'] = cats
    result['archs'] = archs
    result['kv_cache_facts'] = kv_cache_facts(t)
    result['converter_hf_map'] = sorted(hf_map, key=lambda h: h['hf_class'])
    result['converter_unmapped_gguf_archs'] = sorted(set(gguf_names.values()) - set(a['name'] for a in archs.values()))
    result['llm_archs_without_registered_converter'] = sorted(n for n in archs if not hf_by_arch.get(n))
    result['converter_unregistered_classes'] = conv_unreg

    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, 'w') as f:
        json.dump(result, f, indent=1, default=list)
    tables = os.path.join(os.path.dirname(out_path), 'REPORT.tables.md')
    write_tables(result, tables)
    print(json.dumps(result['counts'], indent=1))
    print(f'wrote {tables}')
    print(f'wrote {out_path} ({len(archs)} archs)')


# ----------------------------------------------------------------------------
# markdown tables (derived from the JSON; the prose of REPORT.md is separate)
# ----------------------------------------------------------------------------


def md_escape(x):
    return str(x).replace('|', '\\|').replace('\n', ' ')


def write_tables(result, path):
    archs = result['archs']
    L = []
    L.append('## Counts per category (derived)\n')
    L.append('| category | count | archs |')
    L.append('|---|---|---|')
    for k, v in result['categories'].items():
        shown = ', '.join(v) if k not in ('total', 'rope_yes', 'standard_kv_write_path') else '(see table)'
        L.append(f'| {k} | {len(v)} | {md_escape(shown)} |')
    L.append('')
    L.append('## Full table (derived)\n')
    L.append('Columns: rope = K roped in the graph (yes / partial = only some layers or some model variants / no); '
             'rope_type = llama_model_rope_type(); K names = cb() names given to K along the way, '
             '**bold** = name of the tensor actually passed to build_attn (what cpy_k receives); '
             'swa = always / optional (depends on GGUF hparams) / no.\n')
    L.append('| name | enum | builder (file) | recurrent | hybrid | mla | rope (rope_type) | K names | V final | swa | sinks | Q/K permuted by converter | notes |')
    L.append('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    for n, a in archs.items():
        files = ', '.join(f.split('/')[-1] for f in a['builder_files'])
        builder = f"{a['builder']} ({files})" if a['builder'] else (a.get('builder_note') or 'none')
        kn = ', '.join(('**' + x + '**') if x in a['k_final_names'] else x for x in a['kcur_names'])
        extra = [x for x in a['k_final_names'] if x not in a['kcur_names']]
        if extra:
            kn += (', ' if kn else '') + ', '.join('**' + x + '**' for x in extra)
        rt = a['rope_type'].replace('LLAMA_ROPE_TYPE_', '')
        if len(rt) > 30:
            rt = 'cond.'
        sinks = 'yes' if a['sinks'] else ''
        perm = ', '.join(a['converter_permutes_qk']) or '(no converter)'
        L.append('| ' + ' | '.join(md_escape(x) for x in [
            n, a['enum'].replace('LLM_ARCH_', ''), builder,
            'Y' if a['recurrent'] else '', 'Y' if a['hybrid'] else '',
            '' if a['mla'] == 'no' else a['mla'], f"{a['uses_rope']} ({rt})", kn,
            ', '.join(a['v_final_names']), a['swa'] if a['swa'] != 'no' else '', sinks, perm,
            '; '.join(a['notes'])]) + ' |')
    L.append('')
    L.append('## convert_hf_to_gguf: HF architecture class -> GGUF arch (derived, text models only)\n')
    L.append('Permute verdicts: yes = the registering class itself calls a head permute (LlamaModel.permute or '
             'equivalent) on q/k; yes (inherited) = an ancestor does and the modify_tensors override chain reaches it; '
             'no (undo_permute=False) = reaches LlamaModel.permute but it is disabled; nvfp4 path only = only the '
             'NVFP4 repack permutes.\n')
    L.append('| GGUF arch | HF classes (converter class: permute verdict) |')
    L.append('|---|---|')
    by = defaultdict(list)
    for h in result['converter_hf_map']:
        if h['model_type'] != 'text':
            continue
        keys = [h['gguf_arch']] + [d for d in h['dynamic_arch'] if d != h['gguf_arch']]
        for k in keys:
            by[k].append(h)
    for k in sorted(by, key=lambda x: str(x)):
        items = sorted(by[k], key=lambda h: h['hf_class'])
        txt = '; '.join(f"{h['hf_class']} ({h['converter_class']}: {h['permutes_qk']}"
                        + (', __init__ raises' if h.get('init_raises') else '')
                        + (', dynamic arch' if h['dynamic_arch'] and k != h['gguf_arch'] else '') + ')' for h in items)
        L.append(f'| {k} | {md_escape(txt)} |')
    L.append('')
    L.append('Unregistered converter classes with their own model_arch (used as delegates): ' +
             ', '.join(f"{u['converter_class']}->{u['gguf_arch']} ({u['permutes_qk']})" for u in result['converter_unregistered_classes']))
    L.append('')
    L.append('mmproj (vision/audio projector, GGUF arch "clip") registrations: ' +
             str(sum(1 for h in result['converter_hf_map'] if h['model_type'] == 'mmproj')))
    L.append('')
    L.append('LLM archs without a registered converter: ' + ', '.join(result['llm_archs_without_registered_converter']))
    with open(path, 'w') as f:
        f.write('\n'.join(L) + '\n')


if __name__ == '__main__':
    main()
