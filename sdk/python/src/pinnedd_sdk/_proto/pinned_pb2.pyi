from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
EVENT_KIND_EVICT_ME: EventKind
EVENT_KIND_FENCED: EventKind
EVENT_KIND_READY: EventKind
EVENT_KIND_UNSPECIFIED: EventKind
REASON_DRAIN: Reason
REASON_IDLE: Reason
REASON_OPERATOR: Reason
REASON_SHUTDOWN: Reason
REASON_SWAP: Reason
REASON_UNSPECIFIED: Reason

class ActivateRequest(_message.Message):
    __slots__ = ["generation", "id", "namespace"]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    generation: int
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class ActivateResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AppendItemsOp(_message.Message):
    __slots__ = ["payloads"]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, payloads: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeactivateRequest(_message.Message):
    __slots__ = ["grace_ms", "id", "namespace", "only_if_idle", "reason"]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_IDLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    grace_ms: int
    id: str
    namespace: str
    only_if_idle: bool
    reason: Reason
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., reason: _Optional[_Union[Reason, str]] = ..., grace_ms: _Optional[int] = ..., only_if_idle: bool = ...) -> None: ...

class DeactivateResponse(_message.Message):
    __slots__ = ["abandoned_tasks", "kept"]
    ABANDONED_TASKS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    abandoned_tasks: int
    kept: bool
    def __init__(self, kept: bool = ..., abandoned_tasks: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ["cluster_call_token", "socket_secret", "store_broker_id"]
    CLUSTER_CALL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOCKET_SECRET_FIELD_NUMBER: _ClassVar[int]
    STORE_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_call_token: str
    socket_secret: str
    store_broker_id: int
    def __init__(self, store_broker_id: _Optional[int] = ..., socket_secret: _Optional[str] = ..., cluster_call_token: _Optional[str] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ["data_socket", "hosts", "pid", "sdk_version"]
    DATA_SOCKET_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    data_socket: str
    hosts: _containers.RepeatedCompositeFieldContainer[HostInfo]
    pid: int
    sdk_version: str
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostInfo, _Mapping]]] = ..., data_socket: _Optional[str] = ..., sdk_version: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ["id", "kind", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: EventKind
    namespace: str
    def __init__(self, kind: _Optional[_Union[EventKind, str]] = ..., namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ["serving"]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    def __init__(self, serving: bool = ...) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ["detached_timeout_ms", "namespace", "release_placement_on_idle"]
    DETACHED_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PLACEMENT_ON_IDLE_FIELD_NUMBER: _ClassVar[int]
    detached_timeout_ms: int
    namespace: str
    release_placement_on_idle: bool
    def __init__(self, namespace: _Optional[str] = ..., detached_timeout_ms: _Optional[int] = ..., release_placement_on_idle: bool = ...) -> None: ...

class InstanceStats(_message.Message):
    __slots__ = ["activated_at_ms", "generation", "id", "namespace", "tasks"]
    ACTIVATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    activated_at_ms: int
    generation: int
    id: str
    namespace: str
    tasks: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., generation: _Optional[int] = ..., tasks: _Optional[int] = ..., activated_at_ms: _Optional[int] = ...) -> None: ...

class Seqs(_message.Message):
    __slots__ = ["seqs"]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class SetFieldOp(_message.Message):
    __slots__ = ["name", "value"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ["grace_ms"]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    grace_ms: int
    def __init__(self, grace_ms: _Optional[int] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ["instances"]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStats]
    def __init__(self, instances: _Optional[_Iterable[_Union[InstanceStats, _Mapping]]] = ...) -> None: ...

class StoreCommitRequest(_message.Message):
    __slots__ = ["generation", "id", "mutations", "namespace"]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    generation: int
    id: str
    mutations: _containers.RepeatedCompositeFieldContainer[StoreMutation]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., generation: _Optional[int] = ..., mutations: _Optional[_Iterable[_Union[StoreMutation, _Mapping]]] = ...) -> None: ...

class StoreCommitResponse(_message.Message):
    __slots__ = ["seqs"]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedCompositeFieldContainer[Seqs]
    def __init__(self, seqs: _Optional[_Iterable[_Union[Seqs, _Mapping]]] = ...) -> None: ...

class StoreLoadRequest(_message.Message):
    __slots__ = ["generation", "id", "namespace"]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    generation: int
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class StoreLoadResponse(_message.Message):
    __slots__ = ["trays"]
    TRAYS_FIELD_NUMBER: _ClassVar[int]
    trays: _containers.RepeatedCompositeFieldContainer[TrayData]
    def __init__(self, trays: _Optional[_Iterable[_Union[TrayData, _Mapping]]] = ...) -> None: ...

class StoreMutation(_message.Message):
    __slots__ = ["append_items", "delete_tray", "mark_applied_up_to", "remove_items_up_to", "set_field", "tray_id", "tray_ns"]
    APPEND_ITEMS_FIELD_NUMBER: _ClassVar[int]
    DELETE_TRAY_FIELD_NUMBER: _ClassVar[int]
    MARK_APPLIED_UP_TO_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ITEMS_UP_TO_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_FIELD_NUMBER: _ClassVar[int]
    TRAY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAY_NS_FIELD_NUMBER: _ClassVar[int]
    append_items: AppendItemsOp
    delete_tray: bool
    mark_applied_up_to: int
    remove_items_up_to: int
    set_field: SetFieldOp
    tray_id: str
    tray_ns: str
    def __init__(self, tray_ns: _Optional[str] = ..., tray_id: _Optional[str] = ..., set_field: _Optional[_Union[SetFieldOp, _Mapping]] = ..., append_items: _Optional[_Union[AppendItemsOp, _Mapping]] = ..., mark_applied_up_to: _Optional[int] = ..., remove_items_up_to: _Optional[int] = ..., delete_tray: bool = ...) -> None: ...

class TrayData(_message.Message):
    __slots__ = ["fields", "items", "marked", "tray_id", "tray_ns"]
    class FieldsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MARKED_FIELD_NUMBER: _ClassVar[int]
    TRAY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAY_NS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.ScalarMap[str, bytes]
    items: _containers.RepeatedCompositeFieldContainer[TrayItem]
    marked: bool
    tray_id: str
    tray_ns: str
    def __init__(self, tray_ns: _Optional[str] = ..., tray_id: _Optional[str] = ..., fields: _Optional[_Mapping[str, bytes]] = ..., items: _Optional[_Iterable[_Union[TrayItem, _Mapping]]] = ..., marked: bool = ...) -> None: ...

class TrayItem(_message.Message):
    __slots__ = ["applied", "payload", "seq"]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    payload: bytes
    seq: int
    def __init__(self, seq: _Optional[int] = ..., payload: _Optional[bytes] = ..., applied: bool = ...) -> None: ...

class WindDownRequest(_message.Message):
    __slots__ = ["deadline_unix_ms", "id", "namespace"]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    deadline_unix_ms: int
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ...) -> None: ...

class WindDownResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
