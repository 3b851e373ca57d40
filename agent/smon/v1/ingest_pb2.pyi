from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Coordinates(_message.Message):
    __slots__ = ("job", "rank", "world_size", "local_rank", "host", "gpu_uuid", "dp_rank", "pp_rank", "tp_rank", "dp_size", "pp_size", "tp_size", "pid", "agent_version", "backend", "attempt")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    world_size: int
    local_rank: int
    host: str
    gpu_uuid: str
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_size: int
    pp_size: int
    tp_size: int
    pid: int
    agent_version: str
    backend: str
    attempt: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., local_rank: _Optional[int] = ..., host: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., dp_rank: _Optional[int] = ..., pp_rank: _Optional[int] = ..., tp_rank: _Optional[int] = ..., dp_size: _Optional[int] = ..., pp_size: _Optional[int] = ..., tp_size: _Optional[int] = ..., pid: _Optional[int] = ..., agent_version: _Optional[str] = ..., backend: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("kind", "start", "duration", "microbatch", "chunk", "host_duration", "host_start")
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    HOST_DURATION_FIELD_NUMBER: _ClassVar[int]
    HOST_START_FIELD_NUMBER: _ClassVar[int]
    kind: str
    start: float
    duration: float
    microbatch: int
    chunk: int
    host_duration: float
    host_start: float
    def __init__(self, kind: _Optional[str] = ..., start: _Optional[float] = ..., duration: _Optional[float] = ..., microbatch: _Optional[int] = ..., chunk: _Optional[int] = ..., host_duration: _Optional[float] = ..., host_start: _Optional[float] = ...) -> None: ...

class SequenceStats(_message.Message):
    __slots__ = ("count", "tokens", "sum_sq", "max_len")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUM_SQ_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    count: int
    tokens: int
    sum_sq: float
    max_len: int
    def __init__(self, count: _Optional[int] = ..., tokens: _Optional[int] = ..., sum_sq: _Optional[float] = ..., max_len: _Optional[int] = ...) -> None: ...

class MicroBatchSequences(_message.Message):
    __slots__ = ("microbatch", "seq")
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    microbatch: int
    seq: SequenceStats
    def __init__(self, microbatch: _Optional[int] = ..., seq: _Optional[_Union[SequenceStats, _Mapping]] = ...) -> None: ...

class StepRecord(_message.Message):
    __slots__ = ("step", "start_time", "end_time", "duration", "phases", "spans", "gc_count", "gc_seconds", "seq", "microbatch_seq")
    class PhasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    GC_COUNT_FIELD_NUMBER: _ClassVar[int]
    GC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_SEQ_FIELD_NUMBER: _ClassVar[int]
    step: int
    start_time: float
    end_time: float
    duration: float
    phases: _containers.ScalarMap[str, float]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    gc_count: int
    gc_seconds: float
    seq: SequenceStats
    microbatch_seq: _containers.RepeatedCompositeFieldContainer[MicroBatchSequences]
    def __init__(self, step: _Optional[int] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., duration: _Optional[float] = ..., phases: _Optional[_Mapping[str, float]] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., gc_count: _Optional[int] = ..., gc_seconds: _Optional[float] = ..., seq: _Optional[_Union[SequenceStats, _Mapping]] = ..., microbatch_seq: _Optional[_Iterable[_Union[MicroBatchSequences, _Mapping]]] = ...) -> None: ...

class StepTable(_message.Message):
    __slots__ = ("records", "step", "start_time", "end_time", "duration", "gc_count", "gc_seconds", "span_count", "kinds", "span_kind", "span_start", "span_duration", "span_microbatch", "span_chunk", "seq_count", "seq_tokens", "seq_sum_sq", "seq_max_len", "mb_rows", "mb_microbatch", "mb_count", "mb_tokens", "mb_sum_sq", "mb_max_len", "span_host_duration", "span_host_start")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    GC_COUNT_FIELD_NUMBER: _ClassVar[int]
    GC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPAN_COUNT_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SPAN_KIND_FIELD_NUMBER: _ClassVar[int]
    SPAN_START_FIELD_NUMBER: _ClassVar[int]
    SPAN_DURATION_FIELD_NUMBER: _ClassVar[int]
    SPAN_MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    SPAN_CHUNK_FIELD_NUMBER: _ClassVar[int]
    SEQ_COUNT_FIELD_NUMBER: _ClassVar[int]
    SEQ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQ_SUM_SQ_FIELD_NUMBER: _ClassVar[int]
    SEQ_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MB_ROWS_FIELD_NUMBER: _ClassVar[int]
    MB_MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    MB_COUNT_FIELD_NUMBER: _ClassVar[int]
    MB_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MB_SUM_SQ_FIELD_NUMBER: _ClassVar[int]
    MB_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    SPAN_HOST_DURATION_FIELD_NUMBER: _ClassVar[int]
    SPAN_HOST_START_FIELD_NUMBER: _ClassVar[int]
    records: int
    step: bytes
    start_time: bytes
    end_time: bytes
    duration: bytes
    gc_count: bytes
    gc_seconds: bytes
    span_count: bytes
    kinds: _containers.RepeatedScalarFieldContainer[str]
    span_kind: bytes
    span_start: bytes
    span_duration: bytes
    span_microbatch: bytes
    span_chunk: bytes
    seq_count: bytes
    seq_tokens: bytes
    seq_sum_sq: bytes
    seq_max_len: bytes
    mb_rows: bytes
    mb_microbatch: bytes
    mb_count: bytes
    mb_tokens: bytes
    mb_sum_sq: bytes
    mb_max_len: bytes
    span_host_duration: bytes
    span_host_start: bytes
    def __init__(self, records: _Optional[int] = ..., step: _Optional[bytes] = ..., start_time: _Optional[bytes] = ..., end_time: _Optional[bytes] = ..., duration: _Optional[bytes] = ..., gc_count: _Optional[bytes] = ..., gc_seconds: _Optional[bytes] = ..., span_count: _Optional[bytes] = ..., kinds: _Optional[_Iterable[str]] = ..., span_kind: _Optional[bytes] = ..., span_start: _Optional[bytes] = ..., span_duration: _Optional[bytes] = ..., span_microbatch: _Optional[bytes] = ..., span_chunk: _Optional[bytes] = ..., seq_count: _Optional[bytes] = ..., seq_tokens: _Optional[bytes] = ..., seq_sum_sq: _Optional[bytes] = ..., seq_max_len: _Optional[bytes] = ..., mb_rows: _Optional[bytes] = ..., mb_microbatch: _Optional[bytes] = ..., mb_count: _Optional[bytes] = ..., mb_tokens: _Optional[bytes] = ..., mb_sum_sq: _Optional[bytes] = ..., mb_max_len: _Optional[bytes] = ..., span_host_duration: _Optional[bytes] = ..., span_host_start: _Optional[bytes] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("time", "gpu_index", "gpu_uuid", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "gpu_util", "mem_util", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_w", "power_limit_w", "throttle_reasons", "ecc_corrected", "ecc_uncorrected", "pcie_replay", "xid_events")
    TIME_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MAX_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MAX_MHZ_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_FIELD_NUMBER: _ClassVar[int]
    MEM_UTIL_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    time: float
    gpu_index: int
    gpu_uuid: str
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    mem_clock_mhz: float
    mem_clock_max_mhz: float
    gpu_util: float
    mem_util: float
    mem_used_bytes: float
    mem_total_bytes: float
    temperature_c: float
    power_w: float
    power_limit_w: float
    throttle_reasons: int
    ecc_corrected: int
    ecc_uncorrected: int
    pcie_replay: int
    xid_events: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, time: _Optional[float] = ..., gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., sm_clock_mhz: _Optional[float] = ..., sm_clock_max_mhz: _Optional[float] = ..., mem_clock_mhz: _Optional[float] = ..., mem_clock_max_mhz: _Optional[float] = ..., gpu_util: _Optional[float] = ..., mem_util: _Optional[float] = ..., mem_used_bytes: _Optional[float] = ..., mem_total_bytes: _Optional[float] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., throttle_reasons: _Optional[int] = ..., ecc_corrected: _Optional[int] = ..., ecc_uncorrected: _Optional[int] = ..., pcie_replay: _Optional[int] = ..., xid_events: _Optional[_Iterable[int]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "last_step", "current_step", "phase", "phase_since")
    TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_SINCE_FIELD_NUMBER: _ClassVar[int]
    time: float
    last_step: int
    current_step: int
    phase: str
    phase_since: float
    def __init__(self, time: _Optional[float] = ..., last_step: _Optional[int] = ..., current_step: _Optional[int] = ..., phase: _Optional[str] = ..., phase_since: _Optional[float] = ...) -> None: ...

class AgentCounters(_message.Message):
    __slots__ = ("dropped_records", "errors", "queued", "resent_batches")
    DROPPED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RESENT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    dropped_records: int
    errors: int
    queued: int
    resent_batches: int
    def __init__(self, dropped_records: _Optional[int] = ..., errors: _Optional[int] = ..., queued: _Optional[int] = ..., resent_batches: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("agent_id", "seq", "coords", "steps", "gpu_samples", "heartbeat", "counters", "clock_offset", "sent_time", "final", "step_table")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COORDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GPU_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SENT_TIME_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    STEP_TABLE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    coords: Coordinates
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    gpu_samples: _containers.RepeatedCompositeFieldContainer[GpuSample]
    heartbeat: Heartbeat
    counters: AgentCounters
    clock_offset: float
    sent_time: float
    final: bool
    step_table: StepTable
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., coords: _Optional[_Union[Coordinates, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., gpu_samples: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., counters: _Optional[_Union[AgentCounters, _Mapping]] = ..., clock_offset: _Optional[float] = ..., sent_time: _Optional[float] = ..., final: _Optional[bool] = ..., step_table: _Optional[_Union[StepTable, _Mapping]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("kind", "index", "reason", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    index: int
    reason: str
    detail: str
    def __init__(self, kind: _Optional[str] = ..., index: _Optional[int] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("agent_id", "seq", "accepted", "rejected", "rejections", "duplicate", "throttle_seconds", "step_tables", "flush_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_TABLES_FIELD_NUMBER: _ClassVar[int]
    FLUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    accepted: int
    rejected: int
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    duplicate: bool
    throttle_seconds: float
    step_tables: bool
    flush_seconds: float
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., duplicate: _Optional[bool] = ..., throttle_seconds: _Optional[float] = ..., step_tables: _Optional[bool] = ..., flush_seconds: _Optional[float] = ...) -> None: ...

class HostBatch(_message.Message):
    __slots__ = ("seq", "parts")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    parts: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, seq: _Optional[int] = ..., parts: _Optional[_Iterable[bytes]] = ...) -> None: ...

class HostAck(_message.Message):
    __slots__ = ("seq", "acks", "throttle_seconds", "flush_seconds")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FLUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    throttle_seconds: float
    flush_seconds: float
    def __init__(self, seq: _Optional[int] = ..., acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ..., throttle_seconds: _Optional[float] = ..., flush_seconds: _Optional[float] = ...) -> None: ...

class ClockRequest(_message.Message):
    __slots__ = ("agent_time",)
    AGENT_TIME_FIELD_NUMBER: _ClassVar[int]
    agent_time: float
    def __init__(self, agent_time: _Optional[float] = ...) -> None: ...

class ClockReply(_message.Message):
    __slots__ = ("agent_time", "server_time")
    AGENT_TIME_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    agent_time: float
    server_time: float
    def __init__(self, agent_time: _Optional[float] = ..., server_time: _Optional[float] = ...) -> None: ...
