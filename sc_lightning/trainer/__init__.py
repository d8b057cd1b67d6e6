"""The train pump, Lightning-free: RL-step stream, chunks, policy and critic updates, lr schedule, run records.

Lightning drives it (``sc_lightning/lightning/`` is the adapter), but nothing here imports Lightning: each piece is
plain torch over the controller's port (``controller/api.py``) and the data plane's contract. One RL step ``v``
(= ``trainer.global_step`` = the weight version it trains from), and where each phase runs:

    # --- select: Lightning's data fetcher asks the train dataloader for its next item (no hook) ---
    step = next(RLStepStream)                      step_stream.py; the dataloader is rollout_side.rl_steps()
        first = client.select(v, min, max)        the controller evicts what can never train at v, then waits
                                                   (None: rollouts exhausted, the epoch and the fit end)
    on_train_batch_start                           callbacks/refit.py: a colocated engine stands down
    # --- training_step(step), lightning/module.py (GRPO) ---
    update = PolicyUpdate(...); update.begin(v)    policy_update.py: zero grads, open the step's totals
    for chunk in step.chunks():                    step_stream.py: whole prompt groups, as they become ready
        chunk = load_chunk(data_plane, groups)    chunks.py: read READ_FIELDS by key, pad, GRPO advantages
        update.train_chunk(chunk)                 per micro-batch: forward, seq logprob-error mask, loss as a
                                                   raw sum, backward (gradients accumulate)
        groups = client.select(v, min, left)      until groups_per_step ([]: the step closes short)
    update.finish()                                normalise once by the step's valid tokens (or seqs), clip,
                                                   optimizer.step (global_step -> v + 1), scheduler.step
                                                   (optimizer and schedule: optim.py, lr_schedule.py)
    train_data_log.write(v, step.trained_rows)     train_data_log.py (data.train_data_log)
    sample_log.record(v, read_sampled_prompts(…))  sample_log.py (data.sample_log_prompts): the first groups' answers,
                                                   decoded from the rows still in the data plane
    log train/*, timing/train/*
    # --- on_train_batch_end: refit, then bundle (Lightning runs Checkpoint callbacks after all others) ---
    rollout_side.refit(v + 1)                      callbacks/refit.py -> rollout_side/side.py
        begin_refit(v + 1)                        release the step's rows, close dispatch, abort rollouts that
                                                   can never train
        push_weights(bucket, v + 1) per bucket    the policy in HF names, in bounded buckets
                                                   (refit_gather.py); skipped while PPO's critic
                                                   warms up (policy_trained False)
        finish_refit(v + 1)                       new rollouts are stamped v + 1; dispatch reopens
    if (v + 1) % save_period == 0 or last:         callbacks/checkpoint.py: trainer.ckpt + controller state +
        write bundle step_{v+1}                    data-plane rows, atomically

PPO (lightning/ppo_module.py) replaces the body of training_step:

    batch = concat_chunks(list(step.chunks()))     chunks.py: PPO trains a step as one batch
    targets = value_targets(critic, batch, gae, …) critic_update.py: V_old, terminal rewards, GAE, whitening
                                                   (the policy's AdamW state waits on the CPU meanwhile:
                                                   optim.optimizer_state_to, policy.offload_optimizer_for_logprob)
    CriticUpdate.train(batch, targets, epochs)     critic_ppo_epochs optimizer steps (not counted as RL steps)
    if v >= ppo.policy_training_start_step:
        ppo_epochs x PolicyUpdate over the batch   advantages = GAE; pi_old fixed at the step's start; only the
                                                   last epoch's optimizer step is Lightning's counted step
    else:                                          critic warm-up: the policy optimizer steps without gradients
                                                   (the step still counts), and the refit skips push_weights

With several trainer ranks (lightning/strategy.py's multi-rank strategy) every rank runs the same loop:

    client.select(...)                             rank_sync.py: the leader's controller answers, the answer
                                                   (group metadata) is broadcast to every rank
    step.chunks()                                  data_parallel.py: each data-parallel replica loads only its
                                                   share of the chunk's groups (tensor-parallel peers: the same)
    update.train_chunk(chunk)                      pipeline.py with pipeline stages: megatron's 1F1B schedule,
                                                   the loss on the last stage
    update.finish()                                step_totals.py: counts and metrics summed over the stages and
                                                   replicas; megatron DDP sums the gradients (DataParallelAdamW)
    train_data_log, refit, bundle                  on the leader; the others join the weight gather (TP, PP) and
                                                   write their shards of sharded_checkpoint.py's checkpoint
"""
