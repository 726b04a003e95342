"""Shared KV tiers: DRAM (Redis) and SSD block stores that workers pull from and push to.

Modules: ``protocols`` (``TierClient``, ``WritableTier``), ``redis_tier`` (dram), ``ssd_tier`` (ssd),
``layered`` (dram over ssd, write-behind), ``planner`` (pure pull-or-recompute decision + rate EWMA),
``codec`` (torch: cache blocks <-> wire values; the only module here that imports torch), ``events``
(``stored``/``removed`` KV events for the gateway's index), ``stats``, ``factory`` (``open_tier``: the
tier the worker's ``--kv-tier``/``--ssd-dir`` flags ask for). The wire format itself lives in
``kvgate_core.kvcontract.wire``.

How the engine uses them (built once in the worker's ``main`` and injected; nothing here starts work):

Setup::

    codec = BlockCodec(model_id, KVGeometry.of(kv_cache.layers))    # PagedKVCache.layers: [(k, v)] per layer
    tier = await open_tier(TierSettings(model_id, codec.layout, redis_url=args.kv_tier, ssd_dir=args.ssd_dir),
                           sink=event_hub.publish, worker_id=worker_id)   # None: no tier configured
    pull_bw, prefill = RateEwma(initial=200e6), RateEwma(initial=2000.0)   # bytes/s, tokens/s

On a prefix miss (scheduler, before prefilling a sequence whose first ``local`` blocks hit the GPU cache)::

    n_tier = await tier.contains_prefix(hashes[local:])
    plan = plan_pull(PullRequest(prompt_tokens, block_size, local, n_tier, codec.value_bytes),
                     PullRates(pull_bw.rate, latency_s, prefill.rate))
    if plan.num_blocks:
        t0 = clock(); values = await tier.get_many(hashes[local:local + plan.num_blocks])
        got = leading run of values that are not None        # a hole ends the usable prefix
        codec.load(kv_caches, values[:got], hashes[local:local + got], free_block_ids[:got])
        pull_bw.observe(sum(map(len, values[:got])), clock() - t0)
        # register the loaded blocks in the block manager (hash -> block id), count them as cached tokens
    # prefill the remaining tokens; after it, prefill.observe(tokens_computed, seconds)

``codec.load`` raises ``WireError`` only if a value changed between the tier's check and the load (it
re-checks): treat it like a miss of that block and everything after it.

After prefill (off the token path)::

    values = codec.dump(kv_caches, new_full_block_ids, new_full_block_hashes)
    tier.put_many(list(zip(new_full_block_hashes, values)))       # LayeredTier: queued, returns at once
    # PD prefill worker: await tier.flush() before handing the request to the decode worker

Outages never raise from the tier: a down Redis answers misses and sets ``is_degraded``.
"""
