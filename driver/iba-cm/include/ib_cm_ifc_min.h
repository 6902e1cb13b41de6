/*
 * ib_cm_ifc_min.h: the binary interface of the iba_cm 1.1 kernel CM interface
 * (GUID_INFINIBAND_INTERFACE_CM), as ibcm implements it, for C clients and tests.
 *
 * Written for ibcm from the layout of WinOF's declarations (sizes and offsets as MSVC
 * lays them out for x64, asserted below); it declares only what a CM client needs.
 * It compiles with MSVC (x64) and with GCC/Clang (x86_64), where these layouts agree.
 */
#ifndef IBCM_IB_CM_IFC_MIN_H
#define IBCM_IB_CM_IFC_MIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef _NTDEF_
typedef int32_t NTSTATUS;
#endif

/* Values stored big-endian. */
typedef uint16_t net16_t;
typedef uint32_t net32_t;
typedef uint64_t net64_t;

#if defined(_MSC_VER)
#define IBCM_PACK_BEGIN __pragma(pack(push, 1))
#define IBCM_PACK_END __pragma(pack(pop))
#define IBCM_ALIGN8 __declspec(align(8))
#define IBCM_PACKED
#define IBCM_PACKED_ALIGN8
#else
#define IBCM_PACK_BEGIN
#define IBCM_PACK_END
#define IBCM_ALIGN8
#define IBCM_PACKED __attribute__((packed))
#define IBCM_PACKED_ALIGN8 __attribute__((packed, aligned(8)))
#endif

/* The SA path record: byte-packed members, 8-byte aligned type, 64 bytes. */
IBCM_PACK_BEGIN
typedef struct IBCM_ALIGN8 ibcm_path_rec {
    net64_t service_id;
    uint8_t dgid[16];
    uint8_t sgid[16];
    net16_t dlid;
    net16_t slid;
    net32_t hop_flow_raw;  /* raw:1 (bit 31), flow label:20 (27..8), hop limit:8 */
    uint8_t tclass;
    uint8_t num_path;
    net16_t pkey;
    net16_t qos_class_sl;  /* SL in bits 3..0 */
    uint8_t mtu;           /* selector in bits 7..6, code in 5..0 */
    uint8_t rate;
    uint8_t pkt_life;
    uint8_t preference;
    uint8_t resv2[6];
} IBCM_PACKED_ALIGN8 ib_path_rec_t;

/* Global route header: byte-packed, 40 bytes. */
typedef struct ibcm_grh {
    net32_t ver_class_flow;
    uint16_t resv1;
    uint8_t resv2;
    uint8_t hop_limit;
    uint8_t src_gid[16];
    uint8_t dest_gid[16];
} IBCM_PACKED ib_grh_t;
IBCM_PACK_END

/* Address vector: 56 bytes, 4-aligned. */
typedef struct ibcm_av_attr {
    uint8_t port_num;
    uint8_t sl;
    net16_t dlid;
    int32_t grh_valid; /* boolean_t */
    ib_grh_t grh;
    uint8_t static_rate;
    uint8_t path_bits;
    struct {
        uint8_t path_mtu;
        uint8_t local_ack_timeout;
        uint8_t seq_err_retry_cnt;
        uint8_t rnr_retry_cnt;
    } conn;
} ib_av_attr_t;

#define IB_QPS_RESET 0x01u
#define IB_QPS_INIT 0x02u
#define IB_QPS_RTR 0x04u
#define IB_QPS_RTS 0x08u

#define IB_AC_RDMA_READ 0x01u
#define IB_AC_RDMA_WRITE 0x02u
#define IB_AC_ATOMIC 0x04u
#define IB_AC_LOCAL_WRITE 0x08u

#define IB_MOD_QP_ALTERNATE_AV 0x0001u
#define IB_MOD_QP_APM_STATE 0x0004u

#define IB_APM_MIGRATED 1
#define IB_APM_REARM 2

/* QP modify attributes: 164 bytes, 4-aligned. */
typedef struct ibcm_qp_mod {
    uint32_t req_state;
    union {
        struct {
            uint8_t primary_port;
            net32_t qkey;
            uint16_t pkey_index;
            uint32_t access_ctrl;
        } init;
        struct {
            net32_t rq_psn;
            net32_t dest_qp;
            ib_av_attr_t primary_av;
            uint8_t resp_res;
            uint8_t rnr_nak_timeout;
            uint32_t opts;
            ib_av_attr_t alternate_av;
            net32_t qkey;
            uint16_t pkey_index;
            uint32_t access_ctrl;
            uint32_t sq_depth;
            uint32_t rq_depth;
        } rtr;
        struct {
            net32_t sq_psn;
            uint8_t retry_cnt;
            uint8_t rnr_retry_cnt;
            uint8_t local_ack_timeout;
            uint8_t init_depth;
            uint32_t opts;
            uint8_t rnr_nak_timeout;
            uint32_t current_state;
            net32_t qkey;
            uint32_t access_ctrl;
            uint8_t resp_res;
            ib_av_attr_t primary_av;
            ib_av_attr_t alternate_av;
            uint32_t sq_depth;
            uint32_t rq_depth;
            int32_t apm_state;
            uint8_t primary_port;
            uint16_t pkey_index;
        } rts;
        struct {
            int32_t sqd_event;
        } sqd;
    } state;
} ib_qp_mod_t;

#define IB_QPT_RELIABLE_CONN 0
#define IB_QPT_UNRELIABLE_CONN 1

/* REJ reasons are net16 (IBA Table 112); these are host-order codes. */
#define IBCM_REJ_INVALID_SID 8
#define IBCM_REJ_USER_DEFINED 28

#define IB_REQ_PDATA_SIZE 92
#define IB_REP_PDATA_SIZE 196
#define IB_REJ_PDATA_SIZE 148
#define IB_RTU_PDATA_SIZE 224
#define IB_DREQ_PDATA_SIZE 220
#define IB_DREP_PDATA_SIZE 224
#define IB_LAP_PDATA_SIZE 168
#define IB_APR_PDATA_SIZE 148
#define IB_SIDR_REQ_PDATA_SIZE 216
#define IB_SIDR_REP_PDATA_SIZE 136

/* RDMA-CM IP service: the listen's compare_offset is a mask of these. */
#define IB_REQ_CM_RDMA_CMP_SRC_PORT 0x01
#define IB_REQ_CM_RDMA_CMP_SRC_IP 0x02
#define IB_REQ_CM_RDMA_CMP_DST_IP 0x04

struct iba_cm_event;

typedef struct iba_cm_id {
    void *context;
    NTSTATUS (*callback)(struct iba_cm_id *p_id, struct iba_cm_event *p_event);
    net32_t cid;
} iba_cm_id;

typedef NTSTATUS (*iba_cm_callback)(iba_cm_id *p_id, struct iba_cm_event *p_event);

typedef struct iba_cm_req {
    net64_t service_id;
    ib_path_rec_t *p_primary_path;
    ib_path_rec_t *p_alt_path;
    net32_t qpn;
    int32_t qp_type;
    net32_t starting_psn;
    const void *p_pdata;
    uint8_t pdata_len;
    uint8_t max_cm_retries;
    uint8_t resp_res;
    uint8_t init_depth;
    uint8_t remote_resp_timeout;
    uint8_t flow_ctrl;
    uint8_t local_resp_timeout;
    uint8_t rnr_retry_cnt;
    uint8_t retry_cnt;
    uint8_t srq;
} iba_cm_req;

typedef struct iba_cm_req_event {
    net64_t service_id;
    ib_path_rec_t primary_path;
    ib_path_rec_t alt_path;
    net32_t qpn;
    int32_t qp_type;
    net32_t starting_psn;
    uint8_t pdata[IB_REQ_PDATA_SIZE];
    uint8_t max_cm_retries;
    uint8_t resp_res;
    uint8_t init_depth;
    uint8_t remote_resp_timeout;
    uint8_t flow_ctrl;
    uint8_t local_resp_timeout;
    uint8_t rnr_retry_cnt;
    uint8_t retry_cnt;
    uint8_t srq;
    net64_t local_ca_guid;
    net64_t remote_ca_guid;
    uint16_t pkey_index;
    uint8_t port_num;
} iba_cm_req_event;

typedef struct iba_cm_rep {
    net32_t qpn;
    net32_t starting_psn;
    const void *p_pdata;
    uint8_t pdata_len;
    uint8_t failover_accepted;
    uint8_t resp_res;
    uint8_t init_depth;
    uint8_t flow_ctrl;
    uint8_t rnr_retry_cnt;
    uint8_t srq;
} iba_cm_rep;

typedef struct iba_cm_rep_event {
    iba_cm_rep rep;
    net64_t ca_guid;
    uint8_t target_ack_delay;
} iba_cm_rep_event;

typedef struct iba_cm_pdata {
    void *p_pdata;
    uint8_t pdata_len;
} iba_cm_pdata;

typedef struct iba_cm_rej_event {
    void *ari;
    void *p_pdata;
    net16_t reason;
    uint8_t ari_length;
    uint8_t pdata_len;
} iba_cm_rej_event;

typedef struct iba_cm_mra_event {
    void *p_pdata;
    uint8_t pdata_len;
    uint8_t service_timeout;
} iba_cm_mra_event;

typedef struct iba_cm_lap {
    ib_path_rec_t *p_alt_path;
    void *p_pdata;
    uint8_t pdata_len;
    uint8_t remote_resp_timeout;
} iba_cm_lap;

typedef struct iba_cm_apr {
    void *p_pdata;
    void *p_info;
    uint8_t pdata_len;
    uint8_t info_length;
    uint8_t status;
} iba_cm_apr;

typedef struct iba_cm_sidr_req {
    net64_t service_id;
    ib_path_rec_t *p_path;
    void *p_pdata;
    uint8_t pdata_len;
    uint8_t max_cm_retries;
    uint32_t timeout; /* milliseconds */
} iba_cm_sidr_req;

typedef struct iba_cm_sidr_req_event {
    iba_cm_sidr_req sidr_req;
    net64_t ca_guid;
    uint16_t pkey_index;
    uint8_t port_num;
} iba_cm_sidr_req_event;

typedef struct iba_cm_sidr_rep {
    net32_t qpn;
    net32_t qkey;
    void *p_pdata;
    void *p_info;
    uint8_t pdata_len;
    uint8_t info_len;
    uint8_t status;
} iba_cm_sidr_rep;

enum {
    iba_cm_req_error = 0,
    iba_cm_req_received,
    iba_cm_rep_error,
    iba_cm_rep_received,
    iba_cm_rtu_received,
    iba_cm_dreq_error,
    iba_cm_dreq_received,
    iba_cm_drep_received,
    iba_cm_rej_received,
    iba_cm_mra_received,
    iba_cm_lap_error,
    iba_cm_lap_received,
    iba_cm_apr_received,
    iba_cm_sidr_req_error,
    iba_cm_sidr_req_received,
    iba_cm_sidr_rep_received
};

typedef struct iba_cm_event {
    int32_t type; /* iba_cm_event_type */
    union {
        iba_cm_req_event req;
        iba_cm_rep_event rep;
        iba_cm_pdata rtu;
        iba_cm_pdata dreq;
        iba_cm_pdata drep;
        iba_cm_rej_event rej;
        iba_cm_mra_event mra;
        iba_cm_lap lap;
        iba_cm_apr apr;
        iba_cm_sidr_req_event sidr_req;
        iba_cm_sidr_rep sidr_rep;
    } data;
} iba_cm_event;

typedef struct iba_cm_interface {
    NTSTATUS (*create_id)(iba_cm_callback callback, void *context, iba_cm_id **pp_id);
    void (*destroy_id)(iba_cm_id *p_id);
    NTSTATUS (*listen)(iba_cm_id *p_id, net64_t service_id, void *p_compare_buf,
                       uint8_t compare_len, uint8_t compare_offset);
    NTSTATUS (*get_request)(iba_cm_id *p_listen_id, iba_cm_id **pp_id, iba_cm_event *p_event);
    NTSTATUS (*send_req)(iba_cm_id *p_id, iba_cm_req *p_req);
    NTSTATUS (*send_rep)(iba_cm_id *p_id, iba_cm_rep *p_rep);
    NTSTATUS (*send_rtu)(iba_cm_id *p_id, const void *p_pdata, uint8_t pdata_len);
    NTSTATUS (*send_dreq)(iba_cm_id *p_id, const void *p_pdata, uint8_t pdata_len);
    NTSTATUS (*send_drep)(iba_cm_id *p_id, const void *p_pdata, uint8_t pdata_len);
    NTSTATUS (*send_rej)(iba_cm_id *p_id, net16_t status, const void *p_ari, uint8_t ari_len,
                         const void *p_pdata, uint8_t pdata_len);
    NTSTATUS (*send_mra)(iba_cm_id *p_id, uint8_t service_timeout, const void *p_pdata,
                         uint8_t pdata_len);
    NTSTATUS (*send_lap)(iba_cm_id *p_id, iba_cm_lap *p_lap);
    NTSTATUS (*send_apr)(iba_cm_id *p_id, iba_cm_apr *p_apr);
    NTSTATUS (*send_sidr_req)(iba_cm_id *p_id, iba_cm_sidr_req *p_req);
    NTSTATUS (*send_sidr_rep)(iba_cm_id *p_id, iba_cm_sidr_rep *p_rep);
    NTSTATUS (*get_qp_attr)(iba_cm_id *p_id, uint32_t state, ib_qp_mod_t *p_attr);
    NTSTATUS (*migrate)(iba_cm_id *p_id);
    NTSTATUS (*established)(iba_cm_id *p_id);
    NTSTATUS (*cancel_listen)(iba_cm_id *p_id);
    NTSTATUS (*format_rep)(iba_cm_id *p_id, iba_cm_rep *p_rep, ib_qp_mod_t *p_init);
    NTSTATUS (*send_formatted_rep)(iba_cm_id *p_id);
    NTSTATUS (*get_request_ex)(iba_cm_id *p_listen_id, iba_cm_callback callback, void *context,
                               iba_cm_id **pp_id, iba_cm_event *p_event);
} iba_cm_interface;

/* The WDM INTERFACE header. */
typedef struct ibcm_interface_header {
    uint16_t Size;
    uint16_t Version;
    void *Context;
    void (*InterfaceReference)(void *Context);
    void (*InterfaceDereference)(void *Context);
} ibcm_interface_header;

#define INFINIBAND_INTERFACE_CM_VERSION 0x0101

typedef struct INFINIBAND_INTERFACE_CM {
    ibcm_interface_header InterfaceHeader;
    iba_cm_interface CM;
} INFINIBAND_INTERFACE_CM;

/* {6A11D060-8957-49e6-BE2A-01EDF1BD22B3} */
#define IBCM_GUID_INFINIBAND_INTERFACE_CM \
    { 0x6a11d060, 0x8957, 0x49e6, { 0xbe, 0x2a, 0x01, 0xed, 0xf1, 0xbd, 0x22, 0xb3 } }

/* The layout, asserted (the same facts as the Rust crate's asserts). */
#define IBCM_AT(t, f, o) _Static_assert(offsetof(t, f) == (o), #t "." #f)
#define IBCM_SIZE(t, s, a)                                   \
    _Static_assert(sizeof(t) == (s), "sizeof " #t);         \
    _Static_assert(_Alignof(t) == (a), "alignof " #t)

IBCM_SIZE(ib_path_rec_t, 64, 8);
IBCM_AT(ib_path_rec_t, dgid, 8);
IBCM_AT(ib_path_rec_t, sgid, 24);
IBCM_AT(ib_path_rec_t, dlid, 40);
IBCM_AT(ib_path_rec_t, hop_flow_raw, 44);
IBCM_AT(ib_path_rec_t, pkey, 50);
IBCM_AT(ib_path_rec_t, qos_class_sl, 52);
IBCM_AT(ib_path_rec_t, mtu, 54);
IBCM_AT(ib_path_rec_t, pkt_life, 56);
IBCM_SIZE(ib_grh_t, 40, 1);
IBCM_SIZE(ib_av_attr_t, 56, 4);
IBCM_AT(ib_av_attr_t, grh, 8);
IBCM_AT(ib_av_attr_t, static_rate, 48);
IBCM_AT(ib_av_attr_t, conn, 50);
IBCM_SIZE(ib_qp_mod_t, 164, 4);
IBCM_AT(ib_qp_mod_t, state, 4);
IBCM_AT(ib_qp_mod_t, state.rtr.resp_res, 4 + 64);
IBCM_AT(ib_qp_mod_t, state.rtr.alternate_av, 4 + 72);
IBCM_AT(ib_qp_mod_t, state.rts.init_depth, 4 + 7);
IBCM_AT(ib_qp_mod_t, state.rts.alternate_av, 4 + 88);
IBCM_AT(ib_qp_mod_t, state.rts.apm_state, 4 + 152);
IBCM_AT(ib_qp_mod_t, state.rts.pkey_index, 4 + 158);
IBCM_SIZE(iba_cm_id, 24, 8);
IBCM_AT(iba_cm_id, cid, 16);
IBCM_SIZE(iba_cm_req, 64, 8);
IBCM_AT(iba_cm_req, p_pdata, 40);
IBCM_AT(iba_cm_req, srq, 57);
IBCM_SIZE(iba_cm_req_event, 280, 8);
IBCM_AT(iba_cm_req_event, pdata, 148);
IBCM_AT(iba_cm_req_event, srq, 248);
IBCM_AT(iba_cm_req_event, local_ca_guid, 256);
IBCM_AT(iba_cm_req_event, port_num, 274);
IBCM_SIZE(iba_cm_rep, 24, 8);
IBCM_SIZE(iba_cm_rep_event, 40, 8);
IBCM_SIZE(iba_cm_rej_event, 24, 8);
IBCM_AT(iba_cm_rej_event, reason, 16);
IBCM_SIZE(iba_cm_sidr_req, 32, 8);
IBCM_AT(iba_cm_sidr_req, timeout, 28);
IBCM_SIZE(iba_cm_sidr_req_event, 48, 8);
IBCM_SIZE(iba_cm_sidr_rep, 32, 8);
IBCM_SIZE(iba_cm_event, 288, 8);
IBCM_AT(iba_cm_event, data, 8);
IBCM_SIZE(iba_cm_interface, 176, 8);
IBCM_AT(iba_cm_interface, get_request_ex, 168);
IBCM_SIZE(INFINIBAND_INTERFACE_CM, 208, 8);
IBCM_AT(INFINIBAND_INTERFACE_CM, CM, 32);

#ifdef __cplusplus
}
#endif

#endif /* IBCM_IB_CM_IFC_MIN_H */
