#!/usr/bin/env python3
"""Session 53: least-squares fit of fa3 prefill times (ms, H200) to c x key blocks of all work units / 132 CTAs
+ a fixed cost, per kernel (FP8 e4m3 q, bf16); units as build_tile_plan makes them (192-row tiles anchored at
the request end, 128-key blocks, 32 q heads). Times: session 52 01:33Z (causal) and session 53 05:05Z
(bidirectional 4k / 8k). docs/perf/fa3_notes.md "Session 53"."""
import math, numpy as np
def units(L,B,causal,bm=192,bn=128,H=32):
    us=[]
    for r in range(B):
        t=0
        while L-bm*t>0:
            end=L-bm*t
            nb=math.ceil(end/bn) if causal else math.ceil(L/bn)
            us += [nb]*H
            t+=1
    return us
G=132
data_fp8={('c',4096,4):0.6162,('c',8192,2):1.116,('c',16384,1):2.103,('b',4096,4):1.1301,('b',8192,2):2.1374}
data_bf={('c',4096,4):0.8744,('c',8192,2):1.627,('c',16384,1):3.120,('b',4096,4):1.6537,('b',8192,2):3.1384}
for name,data in [('fp8',data_fp8),('bf16',data_bf)]:
    A=[];y=[]
    for (m,L,B),t in data.items():
        us=units(L,B,m=='c')
        A.append([sum(us)/G, len(us)/G, 1.0]); y.append(t)
    A=np.array(A); y=np.array(y)
    for cols,label in [([0,1],'per-unit x'),([0,2],'per-forward F'),([0,1,2],'both')]:
        sol,res,_,_=np.linalg.lstsq(A[:,cols],y,rcond=None)
        pred=A[:,cols]@sol
        print(name,label,sol, 'max rel err %.3f%%'%(100*max(abs(pred-y)/y)))
