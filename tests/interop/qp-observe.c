/* LD_PRELOAD shim for the data-plane harness's Linux guest: logs every ibv_modify_qp a
 * process makes, with its result, so the harness compares ibcm's QP with what Linux really
 * put on its own. librdmacm makes every QP transition of an rdma_cm application from user
 * space through ibv_modify_qp (rdma-core v44.0 librdmacm/cma.c:1283 INIT, 1304 RTR, 1322
 * RTS, 1380 ERR), with the attributes the kernel CM computed (rdma_init_qp_attr) and the
 * application's accept/connect parameters; perftest adds its own (min_rnr_timer,
 * perftest_communication.c:2324-2326).
 *
 * One line per call, appended to $IBCM_QP_LOG (default /tmp/qp-modify.log):
 *   qp-modify qpn=N mask=0x.. rc=R [state=S] [path_mtu=..] [dest_qpn=..] [rq_psn=..]
 *     [sq_psn=..] [max_rd_atomic=..] [max_dest_rd_atomic=..] [timeout=..] [retry_cnt=..]
 *     [rnr_retry=..] [min_rnr_timer=..]
 * a field present only when its IBV_QP_* bit is in the mask (verbs.h enum ibv_qp_attr_mask).
 * Built by tests/interop/build-guest.sh against the host's verbs.h (the same Debian 12 glibc
 * and rdma-core ABI as the guest). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <infiniband/verbs.h>

typedef int (*modify_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	static modify_fn real;
	char line[512];
	int n, rc, fd;
	const char *path = getenv("IBCM_QP_LOG");

	if (!real)
		real = (modify_fn)dlvsym(RTLD_NEXT, "ibv_modify_qp", "IBVERBS_1.1");
	if (!real)
		real = (modify_fn)dlsym(RTLD_NEXT, "ibv_modify_qp");
	rc = real ? real(qp, attr, mask) : ENOSYS;

	n = snprintf(line, sizeof(line), "qp-modify qpn=%u mask=%#x rc=%d", qp->qp_num,
		     (unsigned)mask, rc);
#define FIELD(bit, fmt, val)                                                        \
	if ((mask & (bit)) && n < (int)sizeof(line))                                 \
		n += snprintf(line + n, sizeof(line) - n, " " fmt, val);
	FIELD(IBV_QP_STATE, "state=%d", (int)attr->qp_state)
	FIELD(IBV_QP_PATH_MTU, "path_mtu=%d", (int)attr->path_mtu)
	FIELD(IBV_QP_DEST_QPN, "dest_qpn=%u", attr->dest_qp_num)
	FIELD(IBV_QP_RQ_PSN, "rq_psn=%u", attr->rq_psn)
	FIELD(IBV_QP_SQ_PSN, "sq_psn=%u", attr->sq_psn)
	FIELD(IBV_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic=%u", (unsigned)attr->max_rd_atomic)
	FIELD(IBV_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic=%u",
	      (unsigned)attr->max_dest_rd_atomic)
	FIELD(IBV_QP_TIMEOUT, "timeout=%u", (unsigned)attr->timeout)
	FIELD(IBV_QP_RETRY_CNT, "retry_cnt=%u", (unsigned)attr->retry_cnt)
	FIELD(IBV_QP_RNR_RETRY, "rnr_retry=%u", (unsigned)attr->rnr_retry)
	FIELD(IBV_QP_MIN_RNR_TIMER, "min_rnr_timer=%u", (unsigned)attr->min_rnr_timer)
#undef FIELD
	if (n >= (int)sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	fd = open(path ? path : "/tmp/qp-modify.log", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		/* One write per line: lines of concurrent processes do not interleave. */
		if (write(fd, line, n) < 0)
			(void)0;
		close(fd);
	}
	return rc;
}
